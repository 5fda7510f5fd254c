"""The one error type a caller's bad input raises, whatever layer notices it."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine refuses; `param` names the offending field (the API's error.param)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
