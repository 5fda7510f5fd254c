"""Request and response bodies: OpenAI completions and chat, and roseinfer's /generate.

Unknown fields are refused (400 naming the field) rather than silently
ignored, as a typo'd or unimplemented option would otherwise change nothing
without a word (vLLM ignores them with a log line; roseinfer prefers the
client to know). OpenAI fields, and the vLLM extensions load generators send,
that roseinfer does not implement are accepted at their neutral value
(n=1, logprobs null/false, penalties 0 or 1, min_p 0...) and refused with a
400 naming the field at any other, so a client that relies on one learns it
at once.

Every field is checked here or in `SamplingParams`, in the handler's thread,
before anything reaches the engine's worker: numbers must be finite (NaN and
Infinity literals are refused), seeds fit a 64-bit generator, and every string,
however deeply nested, must be encodable as UTF-8 (a lone surrogate such as
"\ud800" is refused with the field's path).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from roseinfer.errors import InvalidRequestError
from roseinfer.sampling import SEED_MAX, SEED_MIN, SamplingParams


def first_unencodable_text(value: Any) -> str | None:
    """The first string in `value` (nested lists and dicts, keys too) that UTF-8 cannot encode.

    Iterative, so a deeply nested body cannot exhaust the stack.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return None


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _encodable_text(cls, value: Any) -> Any:
        if first_unencodable_text(value) is not None:
            raise PydanticCustomError(
                "unencodable_text", "contains text that cannot be encoded as UTF-8 (a lone surrogate?)"
            )
        return value


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# What the OpenAI fields roseinfer does not implement must be left at.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False),
    # vLLM's extensions that load generators send at their neutral value
    # (`vllm bench serve` always sends repetition_penalty: 1.0).
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0),
    "stop_token_ids": (None, []),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "use_beam_search": (None, False),
}


class SamplingFields(StrictModel):
    """Fields shared by completions and chat completions."""

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # roseinfer/vLLM extension; -1 or 0: off
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension, used by load generators
    user: str | None = None  # an end-user id; recorded by nobody, accepted for compatibility
    # Accepted only at their neutral value:
    n: int | None = None
    best_of: int | None = None
    logprobs: int | bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    use_beam_search: bool | None = None

    def check_supported(self) -> None:
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name, None)
            # Compare types too: 0 == False in Python, but logprobs=0 asks for something.
            if not any(type(value) is type(v) and value == v for v in neutral):
                raise InvalidRequestError(
                    f"'{name}' = {value!r} is not supported by roseinfer (only {neutral[-1]!r})", name
                )
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true", "stream_options")

    def sampling_params(self, max_new_tokens: int | None) -> SamplingParams:
        """None: up to the model's context (the engine knows the prompt's length)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            seed=self.seed,
            stop_on_eos=not self.ignore_eos,
            stop=stop,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        if all(isinstance(x, str) for x in p) or all(isinstance(x, list) for x in p):
            return list(p)
        raise InvalidRequestError("prompt must be a string, a list of strings, or token ids", "prompt")


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(StrictModel):
    type: Literal["text"]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class GenerateRequest(StrictModel):
    """roseinfer's own simple endpoint (HF-style field names)."""

    prompt: str = Field(min_length=1)
    max_new_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_k: int = Field(default=0, ge=0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop_on_eos: bool = True
    do_sample: bool = False  # False: greedy, whatever the temperature
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: list[str] | None = None
    stream: bool = False

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature if self.do_sample else 0.0,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop_on_eos=self.stop_on_eos,
            stop=list(self.stop or []),
        )


def envelope(id_prefix: str, object_: str, model: str) -> dict[str, Any]:
    """The fields every completion response and chunk starts with."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": object_,
        "created": int(time.time()),
        "model": model,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict:
    """OpenAI's error shape. Text that quotes the request is made encodable (a lone surrogate
    becomes the six characters \\ud800), so an error about bad text never fails to be sent."""
    return {
        "error": {"message": _encodable(message), "type": type_, "param": _encodable(param), "code": code}
    }


def _encodable(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")
