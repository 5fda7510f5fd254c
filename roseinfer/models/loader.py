"""Where the weights come from.

`load_weights` resolves a model name or path in this order:

1. a local directory in Hugging Face layout (config.json + model.safetensors,
   sharded safetensors, or pytorch_model.bin);
2. an explicit roseinfer checkpoint (`checkpoint_path`, or a path to a file);
3. a Hub id or preset name found in the local Hugging Face cache (looked up
   with `local_files_only`, so it never touches the network or hangs);
4. the same id downloaded from the Hub (config.json + safetensors, see
   roseinfer.hub), unless offline (`HF_HUB_OFFLINE=1` or `offline=True`) or
   the Hub does not answer within a few seconds;
5. a preset architecture with seeded random weights.

What was loaded is always said: `LoadedWeights.description` goes into the
start-up log and `/v1/models`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from roseinfer import hub
from roseinfer.config import PRESET_HF_IDS, PRESETS, ModelConfig, preset_for
from roseinfer.models.registry import model_family

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "roseinfer-gpt2"  # the name of version 1, kept so old files load
CHECKPOINT_VERSION = 1

@dataclass
class LoadedWeights:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]  # roseinfer names, fp32 or the checkpoint's dtype
    source: str  # "hf-directory" | "hf-cache" | "hf-hub" | "checkpoint" | "random"
    description: str
    # Where they came from, as a user would name it again: a directory or checkpoint path, a Hub id, or (random
    # weights) the preset's name. /v1/models gives it as `root`, which a gateway shows as the model's path.
    location: str = ""
    # The Hugging Face directory they were read from (its tokenizer and chat template live there too); "" else.
    folder: str = ""

    @property
    def is_random(self) -> bool:
        return self.source == "random"


def _read_hf_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(str(directory / shard)))
        return tensors
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{directory}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def load_hf_directory(directory: str | Path, source: str = "hf-directory", label: str = "",
                      location: str = "") -> LoadedWeights:
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{directory}: no config.json, so not a Hugging Face model directory")
    hf_config = json.loads(config_file.read_text())
    try:
        family = model_family(hf_config.get("model_type", "gpt2"))
    except ValueError as exc:
        raise ValueError(f"{directory}: {exc}") from None
    config = _with_generation_config(family.config_from_hf(hf_config), directory)
    state = family.state_dict_from_hf(_read_hf_tensors(directory), config)
    return LoadedWeights(config, state, source, label or f"HF checkpoint {directory}", location or str(directory),
                         str(directory))


def _with_generation_config(config: ModelConfig, directory: Path) -> ModelConfig:
    """The end-of-text and end-of-turn ids of generation_config.json (an instruct model's <|im_end|> or
    <|eot_id|>, which config.json may not list), added to config.json's."""
    path = directory / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    if eos is None:
        return config
    ids = [eos] if isinstance(eos, int) else list(eos)
    stops = tuple(dict.fromkeys([*config.stop_token_ids, *ids]))
    return replace(config, stop_token_ids=tuple(i for i in stops if i != config.eos_token_id))


def save_hf_directory(
    directory: str | Path, config: ModelConfig, state_dict: dict[str, torch.Tensor]
) -> Path:
    """Write weights in HF layout, so transformers' `from_pretrained` runs the very same model."""
    from safetensors.torch import save_file

    family = model_family(config.family)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_state = family.state_dict_to_hf(state_dict)
    save_file(hf_state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(family.config_to_hf(config), indent=2))
    return directory


def save_checkpoint(path: str | Path, config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """roseinfer's own checkpoint: one file with the architecture and the weights."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model_config": asdict(config),
        "state_dict": {k: v.detach().cpu() for k, v in state_dict.items()},
    }
    torch.save(payload, Path(path))


def load_checkpoint(path: str | Path) -> LoadedWeights:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a roseinfer checkpoint (see roseinfer.models.loader.save_checkpoint)")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: checkpoint version {payload.get('version')} is not {CHECKPOINT_VERSION}")
    config = ModelConfig(**payload["model_config"])
    return LoadedWeights(config, payload["state_dict"], "checkpoint", f"roseinfer checkpoint {path}", str(path))


def random_weights(preset: str, seed: int, why: str = "no checkpoint given") -> LoadedWeights:
    config = PRESETS[preset]
    with torch.device("meta"):
        model = model_family(config.family)(config)
    model = model.to_empty(device="cpu").init_random_(seed)
    return LoadedWeights(
        config,
        model.state_dict(),
        "random",
        f"RANDOM weights: preset {preset!r} initialised with seed {seed} ({why})",
        preset,
    )


def load_weights(
    name_or_path: str,
    checkpoint_path: str | None = None,
    hf_model_id: str | None = None,
    seed: int = 0,
    offline: bool = False,
) -> LoadedWeights:
    path = Path(name_or_path)
    if path.is_dir():
        return load_hf_directory(path)
    if checkpoint_path is not None:
        return load_checkpoint(checkpoint_path)
    if path.is_file():
        return load_checkpoint(path)
    name = hf_model_id or name_or_path
    if name in PRESET_HF_IDS:
        repo_ids = PRESET_HF_IDS[name]
    elif hub.is_repo_id(name) and (hf_model_id or "/" in name):
        repo_ids = (name,)
    else:
        repo_ids = ()  # gpt2-tiny, or a typo: nothing to look up
    why = "no checkpoint given"
    if repo_ids:
        try:
            found = hub.resolve(repo_ids, hub.MODEL_FILE_SETS, hub.download_model, offline)
        except (hub.HubUnavailable, hub.NotOnHub) as exc:
            why = f"{' / '.join(repo_ids)} is not in the local Hugging Face cache; {exc}"
        else:
            label = (
                f"local HF cache {found.repo_id} ({found.folder})"
                if found.source == "hf-cache"
                else f"HF Hub {found.repo_id}, downloaded from {hub.endpoint()} to {found.folder}"
            )
            return load_hf_directory(found.folder, found.source, label, found.repo_id)
    preset = preset_for(name)
    if preset is not None:
        return random_weights(preset, seed, why)
    if repo_ids:
        raise FileNotFoundError(f"cannot load {name!r}: {why}")
    raise ValueError(
        f"unknown model {name_or_path!r}: not a local directory or file, not a Hub id, "
        f"and not a preset ({', '.join(PRESETS)})"
    )
