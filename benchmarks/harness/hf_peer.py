"""The Hugging Face transformers peer: the same weights run by HF, for side-by-side runs.

hf_generate        GPT2LMHeadModel.generate: one static, left-padded batch,
                   run to the longest request (each output cut to its own length)
hf_generate_batch  transformers' continuous batching (paged attention): generate_batch,
                   or its manager when requests have their own max_new_tokens
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from roseinfer.bench.workloads import BenchRequest
from roseinfer.models.loader import save_hf_directory
from roseinfer.sampling import SamplingParams


def hf_model_for(engine, model_dir: str | None = None):
    """HF GPT2LMHeadModel on exactly the engine's weights (exported to a temp dir unless given)."""
    from transformers import GPT2LMHeadModel

    directory = Path(model_dir) if model_dir else None
    if directory is None or engine.weights.source != "hf-directory":
        directory = Path(tempfile.mkdtemp(prefix="roseinfer-hf-"))
        state = {k: v for k, v in engine.runner.model.state_dict().items()}
        save_hf_directory(directory, engine.model_config, state)
    model = GPT2LMHeadModel.from_pretrained(directory, dtype=engine.dtype).to(engine.device).eval()
    model.generation_config.pad_token_id = 0
    return model


def run_roseinfer(engine, requests: list[BenchRequest]) -> list[list[int]]:
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]
    outs = engine.generate([r.prompt_token_ids for r in requests], params, max_batch_size=len(requests))
    return [o.token_ids for o in outs]


def run_hf_generate(model, requests: list[BenchRequest]) -> list[list[int]]:
    longest_prompt = max(len(r.prompt_token_ids) for r in requests)
    ids = torch.zeros((len(requests), longest_prompt), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):  # left padding, as decoder-only generation needs
        ids[i, longest_prompt - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
        mask[i, longest_prompt - len(r.prompt_token_ids) :] = 1
    steps = max(r.max_new_tokens for r in requests)
    with torch.inference_mode():
        out = model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [
        out[i, longest_prompt : longest_prompt + r.max_new_tokens].tolist() for i, r in enumerate(requests)
    ]


def run_hf_generate_batch(model, requests: list[BenchRequest]) -> list[list[int]]:
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        max_new_tokens=max(r.max_new_tokens for r in requests),
    )
    if len({r.max_new_tokens for r in requests}) == 1:
        outs = model.generate_batch(
            [r.prompt_token_ids for r in requests],
            generation_config=config,
            max_new_tokens=requests[0].max_new_tokens,
        )
        return [outs[f"req_{i}"].generated_tokens for i in range(len(requests))]
    # Per-request lengths go through the continuous-batching manager that generate_batch wraps.
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    try:
        ids = [manager.add_request(r.prompt_token_ids, max_new_tokens=r.max_new_tokens) for r in requests]
        results = {}
        while len(results) < len(ids):
            result = manager.get_result(timeout=600)
            if result is None:
                raise RuntimeError("transformers' continuous batching stopped early")
            if result.is_finished():
                results[result.request_id] = result.generated_tokens
    finally:
        manager.stop(block=True)
    return [results[i] for i in ids]
