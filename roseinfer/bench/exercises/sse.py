"""Notebook 13's exercise: one streamed completion framed as server-sent events."""

from __future__ import annotations

from collections.abc import Callable

SSE_BASE = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "gpt2"}
SSE_PIECES = ["Hello", ",", " new\nline", " caf\u00e9"]


def check_frame_stream(frame: Callable) -> str:
    """Notebook 13: `frame(base, pieces, finish_reason)` must return the body of one streamed completion, as the
    server sends it: a `data: <chunk JSON>` event per piece, one chunk with the finish reason, then `data: [DONE]`."""
    import json

    try:
        out = frame(dict(SSE_BASE), list(SSE_PIECES), "length")
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your framing"
    if not isinstance(out, str):
        return f"FAIL: return the whole body as one str (got {type(out).__name__})"
    if "new\nline" in out:
        return ("FAIL: a raw newline inside an event: the piece ' new\\nline' was written as it is, and a newline "
                "ends the event's line; json.dumps the chunk (it writes the newline as \\n)")
    if not out.endswith("\n\n") or any("\n" in e for e in out.split("\n\n")):
        return ("FAIL: each event ends with a blank line ('\\n\\n'): without it the client reads the next event as "
                "part of this one")
    events = out.split("\n\n")[:-1]
    if not all(e.startswith("data: ") for e in events):
        return "FAIL: every event is one line starting with 'data: ' (then the JSON, or [DONE])"
    payloads = [e.removeprefix("data: ") for e in events]
    if payloads[-1] == '"[DONE]"':
        return "FAIL: [DONE] is sent as it is, `data: [DONE]`, not as a JSON string"
    if payloads[-1] != "[DONE]":
        return "FAIL: the stream must end with `data: [DONE]`, OpenAI's end-of-stream marker"
    try:
        chunks = [json.loads(p) for p in payloads[:-1]]
    except json.JSONDecodeError as exc:
        return f"FAIL: an event's data is not JSON ({exc}): json.dumps each chunk"
    if len(chunks) == len(SSE_PIECES):
        return ("FAIL: no chunk of its own carries the finish reason: after the pieces, send one more chunk with "
                "text '' and finish_reason")
    if len(chunks) != len(SSE_PIECES) + 1:
        return f"FAIL: {len(chunks)} chunks for {len(SSE_PIECES)} pieces (expected one a piece, then one to finish)"
    if not all(isinstance(c, dict) and all(c.get(k) == v for k, v in SSE_BASE.items()) for c in chunks):
        return "FAIL: every chunk carries the envelope (`base`: id, object, created, model), not only the first"
    try:
        choices = [c["choices"][0] for c in chunks]
        texts = [ch["text"] for ch in choices]
        reasons = [ch["finish_reason"] for ch in choices]
    except (KeyError, IndexError, TypeError):
        return "FAIL: each chunk needs choices: [{index, text, logprobs, finish_reason}]"
    if texts[:-1] != SSE_PIECES or texts[-1] != "":
        return f"FAIL: the chunks' texts are {texts}: expected each piece unchanged, then ''"
    if any(r is not None for r in reasons[:-1]):
        return "FAIL: finish_reason is null on the pieces' chunks, set only on the last"
    if reasons[-1] != "length":
        return f"FAIL: the last chunk's finish_reason is {reasons[-1]!r}, expected the one passed in, 'length'"
    if any(ch.get("index") != 0 for ch in choices):
        return "FAIL: a single completion's choices all have index 0"
    return ("PASS: one `data:` event a piece (a newline in a piece JSON-escaped), a chunk with the finish reason, "
            "the envelope on every chunk, then `data: [DONE]`; a blank line after each event")
