"""The CPU stand-ins virtual CUDA puts in place of `torch.cuda`, `torch.Generator` and Triton's launcher.

Each stub behaves as the CPU would: streams and events order nothing (the CPU
runs every op when it is issued), synchronize only counts, pinned memory is
ordinary memory marked as pinned. What a stub cannot honestly stand in for,
it refuses: graph capture raises rather than pretending to record.
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace
from typing import Any

import torch

FREE_BYTES, TOTAL_BYTES = 1 << 30, 2 << 30
DEVICE_NAME = "virtual CUDA (CPU tensors)"

_saved: dict[tuple[Any, str], Any] = {}
_state: Any = None
_fail: Any = None
_is_cuda: Any = None


class VirtualGenerator(torch.Generator):
    """A CPU generator that remembers the device it was made for."""

    def __new__(cls, device: str | torch.device = "cpu") -> VirtualGenerator:
        gen = super().__new__(cls, "cpu")
        gen._device = torch.device(device)
        if gen._device.type == "cuda" and gen._device.index is None:
            gen._device = torch.device("cuda", 0)
        return gen

    @property
    def device(self) -> torch.device:
        return self._device


def generator_device(gen: torch.Generator) -> torch.device:
    return getattr(gen, "_device", None) or gen.device


class Stream:
    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device = torch.device("cuda", 0)

    def wait_stream(self, stream: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = Stream()


class Event:
    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._time = time.perf_counter()

    def elapsed_time(self, end: Event) -> float:
        return (end._time - self._time) * 1000

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True


class CUDAGraph:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "virtual CUDA does not emulate CUDA graph capture; run the graph path uncaptured (capture=False)"
        )


def synchronize(device: Any = None) -> None:
    _state.synced()


def _stream_context(stream: Stream | None) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(stream)


def _device_context(device: Any) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext(device)


CUDA_STUBS = {
    "is_available": lambda: True,
    "is_initialized": lambda: True,
    "init": lambda: None,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "set_device": lambda device: None,
    "device": _device_context,
    "synchronize": synchronize,
    "Stream": Stream,
    "Event": Event,
    "current_stream": lambda device=None: _DEFAULT_STREAM,
    "default_stream": lambda device=None: _DEFAULT_STREAM,
    "stream": _stream_context,
    "CUDAGraph": CUDAGraph,
    "graph": CUDAGraph,
    "graph_pool_handle": lambda: object(),
    "mem_get_info": lambda device=None: (FREE_BYTES, TOTAL_BYTES),
    "get_device_name": lambda device=None: DEVICE_NAME,
    "get_device_capability": lambda device=None: (9, 0),
    "get_device_properties": lambda device=None: SimpleNamespace(
        name=DEVICE_NAME, major=9, minor=0, total_memory=TOTAL_BYTES, multi_processor_count=1
    ),
    "is_bf16_supported": lambda including_emulation=True: True,
    "empty_cache": lambda: None,
    # The CUDA generator is the CPU's default one here. Not torch.manual_seed: it calls
    # torch.cuda.manual_seed_all itself, which would recurse.
    "manual_seed": lambda seed: torch.default_generator.manual_seed(int(seed)),
    "manual_seed_all": lambda seed: torch.default_generator.manual_seed(int(seed)),
    "memory_allocated": lambda device=None: 0,
    "max_memory_allocated": lambda device=None: 0,
    "reset_peak_memory_stats": lambda device=None: None,
}


def _check_kernel_args(args: tuple, kwargs: dict) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and not _is_cuda(a):
            _fail(
                f"a Triton kernel got a host tensor {tuple(a.shape)} (cannot be accessed from Triton: cpu tensor?)"
            )


def _patch(owner: Any, name: str, value: Any) -> None:
    _saved.setdefault((owner, name), getattr(owner, name, None))
    setattr(owner, name, value)


def install(state: Any, fail: Any, is_cuda: Any) -> None:
    global _state, _fail, _is_cuda
    _state, _fail, _is_cuda = state, fail, is_cuda
    for name, stub in CUDA_STUBS.items():
        _patch(torch.cuda, name, stub)
    _patch(torch, "Generator", VirtualGenerator)
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    run = _saved.get((InterpretedFunction, "run")) or InterpretedFunction.run

    def checked_run(self, *args, grid, warmup, **kwargs):
        _check_kernel_args(args, kwargs)
        state.kernel_launches += 1
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    _patch(InterpretedFunction, "run", checked_run)


def uninstall() -> None:
    for (owner, name), value in _saved.items():
        setattr(owner, name, value)
    _saved.clear()
