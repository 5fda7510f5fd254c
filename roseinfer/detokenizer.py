"""Turning a stream of token ids into a stream of text, safely.

GPT-2 tokens are byte sequences, and one character (é, 你, 🙂) can be split
across two or three tokens. Decoding each token on its own would print
U+FFFD for the halves; instead the bytes go through an incremental UTF-8
decoder that holds an incomplete character until its last byte arrives. The
pieces therefore concatenate to exactly `tokenizer.decode(all_ids)`.

`TextStream` adds stop strings on top: text that might be the start of a
stop string is held back until it is known not to be one, and the stream
ends right before the first stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from roseinfer.sampling import SamplingParams
from roseinfer.tokenizer import GPT2Tokenizer


class IncrementalDetokenizer:
    def __init__(self, tokenizer: GPT2Tokenizer) -> None:
        self._tokenizer = tokenizer
        # "replace" matches the BPE decoder's lossy decoding of invalid bytes.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that this token completes (possibly empty)."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held; an unfinished character becomes U+FFFD, as in `decode`."""
        return self._decoder.decode(b"", final=True)


def first_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """Index of the earliest stop string in text[start:], or -1."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else -1


class TextStream:
    """Token ids in, text pieces out, honouring stop strings.

    `push(token_id)` returns the text that is safe to show now; `stopped`
    turns True when a stop string has appeared (the text shown ends right
    before it); `finish()` returns what was held back.
    """

    def __init__(self, tokenizer: GPT2Tokenizer, stop: Iterable[str] = ()) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stops = [s for s in stop if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""
        self._shown = 0  # characters of _text already returned
        self.stopped = False

    @property
    def text(self) -> str:
        """The text shown so far plus any held-back tail."""
        return self._text

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        return self._advance(self._detok.push(token_id))

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def finish(self) -> str:
        """The rest of the text, once no more tokens will come."""
        if self.stopped:
            return ""
        piece = self._advance(self._detok.flush())
        if self.stopped:
            return piece
        tail = self._text[self._shown :]
        self._shown = len(self._text)
        return piece + tail

    def _advance(self, piece: str) -> str:
        if not piece:
            return ""
        before = len(self._text)
        self._text += piece
        if not self._stops:
            self._shown = len(self._text)
            return piece
        # A new stop can only start in the last (longest - 1) characters of old text.
        at = first_stop(self._text, self._stops, max(0, before - self._longest + 1))
        if at >= 0:
            self.stopped = True
            self._text = self._text[:at]
            out = self._text[self._shown :]
            self._shown = len(self._text)
            return out
        safe = len(self._text) - self._held_back()
        out = self._text[self._shown : safe]
        self._shown = max(self._shown, safe)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the text that could still grow into a stop string.

        Only tails that begin with a stop's first character can, so each stop
        costs a few `find`s over its own length, not a scan of every tail.
        """
        text, end = self._text, len(self._text)
        longest = 0
        for stop in self._stops:
            at = text.find(stop[0], max(0, end - len(stop) + 1))  # a tail shorter than the stop
            while at != -1 and end - at > longest:
                if stop.startswith(text[at:]):
                    longest = end - at
                    break
                at = text.find(stop[0], at + 1)
        return longest


class RequestText(TextStream):
    """One request's text: its EOS hidden, its stop strings honoured.

    This is the one owner of a request's stop strings. Whoever reads a
    request's text keeps one (`InferenceEngine.generate`, the server's
    stream) and ends the request in the scheduler when `stopped` turns True;
    the scheduler itself never detokenizes.
    """

    def __init__(self, tokenizer: GPT2Tokenizer, params: SamplingParams, eos_token_ids: frozenset[int]) -> None:
        super().__init__(tokenizer, params.stop)
        self._params = params
        self._eos_token_ids = eos_token_ids

    def push(self, token_id: int) -> str:
        if self._params.is_eos_stop(token_id, self._eos_token_ids):
            return ""  # EOS ends the text; it is counted as generated, never shown
        return super().push(token_id)
