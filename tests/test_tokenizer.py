"""GPT-2 BPE from the embedded files, and the incremental, UTF-8-safe detokenizer."""

from __future__ import annotations

import random

import pytest

from roseinfer.detokenizer import IncrementalDetokenizer, TextStream
from roseinfer.tokenizer import GPT2Tokenizer

TEXTS = [
    "Hello world, this is a test",
    "Crème brûlée, naïve façade, Ångström",
    "東京の天気は晴れです。北京欢迎你！",
    "Emoji: 🙂🚀🎉 👩‍👩‍👧 🇫🇷",
    "  leading spaces\n\ttabs and\r\nnewlines  ",
    "mixed 123 ÆØÅ Ελληνικά русский עברית العربية",
]


@pytest.fixture(scope="module")
def tok() -> GPT2Tokenizer:
    return GPT2Tokenizer.from_pretrained()


def test_known_gpt2_ids(tok):
    assert tok.encode("Hello world, this is a test") == [15496, 995, 11, 428, 318, 257, 1332]
    assert tok.encode(" the") == [262]
    assert tok.eos_token_id == 50256
    assert tok.encode("<|endoftext|>") == [50256]
    assert tok.vocab_size == 50257


def test_matches_hf_gpt2_tokenizer_from_the_same_files(tok, tmp_path):
    import shutil

    from transformers import GPT2TokenizerFast

    from roseinfer.tokenizer import embedded_bpe_files

    vocab, merges = embedded_bpe_files()
    shutil.copy(vocab, tmp_path / "vocab.json")
    shutil.copy(merges, tmp_path / "merges.txt")
    hf = GPT2TokenizerFast.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert tok.encode(text) == hf.encode(text)
        assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text)) == text


def test_local_tokenizer_directory(tok, tmp_path):
    import shutil

    from roseinfer.tokenizer import embedded_bpe_files

    vocab, merges = embedded_bpe_files()
    shutil.copy(vocab, tmp_path / "vocab.json")
    shutil.copy(merges, tmp_path / "merges.txt")
    local = GPT2Tokenizer.from_pretrained(str(tmp_path))
    assert local.encode(TEXTS[2]) == tok.encode(TEXTS[2])
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        GPT2Tokenizer.from_pretrained(str(tmp_path / "missing"))


def test_round_trip(tok):
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text


def _stream(tok, ids) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(t) for t in ids]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_stream_pieces_concatenate_to_decode_without_replacement_chars(tok, text):
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)


def test_split_characters_are_really_exercised(tok):
    """At least one test text has a character split over tokens, held back then completed."""
    ids = tok.encode(TEXTS[2] + TEXTS[3])
    partial = [t for t in ids if not _is_complete_utf8(tok.token_bytes(t))]
    assert partial, "expected some tokens holding part of a character"
    detok = IncrementalDetokenizer(tok)
    held = [detok.push(t) for t in ids]
    assert "" in held  # a token that completes nothing yields nothing, not U+FFFD


def _is_complete_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_random_token_streams_match_decode(tok):
    """Arbitrary ids (invalid UTF-8 included): the stream still equals decode(ids)."""
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 20))]
        assert "".join(_stream(tok, ids)) == tok.decode(ids)


def test_text_stream_stop_strings_hold_back_and_cut(tok):
    text = "The answer is 42. END of story"
    ids = tok.encode(text)
    stream = TextStream(tok, stop=["END", "never"])
    pieces = []
    for t in ids:
        pieces.append(stream.push(t))
        if stream.stopped:
            break
    pieces.append(stream.finish())
    assert "".join(pieces) == "The answer is 42. "
    assert stream.stopped
    # A suffix that might start a stop string is held until it cannot.
    stream = TextStream(tok, stop=["Hello there"])
    shown = stream.push_many(tok.encode("Say Hello"))
    assert shown == "Say "
    assert stream.push_many(tok.encode(" world")) == "Hello world"
    assert stream.finish() == ""


def test_text_stream_without_stop_passes_everything(tok):
    ids = tok.encode(TEXTS[3])
    stream = TextStream(tok)
    assert stream.push_many(ids) + stream.finish() == TEXTS[3]


def test_held_back_tail_is_the_longest_that_could_grow_into_a_stop(tok):
    """The held-back tail equals its definition: the longest tail that is a proper prefix of a stop."""
    rng = random.Random(1)
    alphabet = "ab a"
    for _ in range(300):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7))) for _ in range(3)]
        stream = TextStream(tok, stop=stops)
        stream._text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        text = stream._text
        expected = max(
            (n for n in range(1, len(text) + 1) for s in stops if len(s) > n and s.startswith(text[-n:])),
            default=0,
        )
        assert stream._held_back() == expected, (text, stops)


def test_sentencepiece_style_tokens_map_to_their_bytes():
    """Llama 2 / TinyLlama vocabularies write a space as "▁", raw bytes as "<0xNN>", the rest as UTF-8 text."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"▁hello": 0, "<0x0A>": 1, "é": 2, "<s>": 3}  # a SentencePiece piece is UTF-8 text
    tok = GPT2Tokenizer(Tokenizer(WordLevel(vocab, unk_token="<s>")), vocab, "test")
    assert [tok.token_bytes(i) for i in range(4)] == [b" hello", b"\n", "é".encode(), b"<s>"]
