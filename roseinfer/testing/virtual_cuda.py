"""Virtual CUDA: run every CUDA branch of roseinfer on a CPU, and fail on any device mix-up.

No GPU is available to this project, yet most CUDA bugs are not about the GPU:
a tensor left on the host, a generator made for the wrong device, a copy that
is not the asynchronous one the code claims. Those need only the *devices* to
be right, so this mode keeps every tensor on the CPU while making the program
believe it has a GPU:

- a tensor asked for on "cuda" (a factory's `device=`, `.to("cuda")`,
  `.cuda()`, `Module.to`) is a CPU tensor tagged as CUDA: it reports
  `cuda:0`, and every result computed from a tagged tensor is tagged too;
- an op that mixes a tagged tensor with an untagged CPU tensor that is not a
  0-dim scalar fails, as it would on a GPU, naming the roseinfer line;
  `copy_` is the one legal mix (a host-device copy), and an asynchronous
  host-to-device copy must be contiguous on both sides (else torch stages it
  through an unpinned temporary and it is neither single nor asynchronous);
- `torch.Generator(device=...)` remembers its device, and a random op on a
  device other than its generator's fails;
- a Triton kernel launched on an untagged tensor fails (on a CUDA machine,
  Triton cannot read host memory); kernels run in Triton's interpreter;
- the `torch.cuda` calls the engine makes are CPU stubs: synchronize, streams,
  events, pinned memory, device facts, `mem_get_info` (a made-up 1 GiB free).
  Graph capture is not emulated: `torch.cuda.CUDAGraph` raises, and the engine
  runs its padded static-buffer decode path uncaptured (`capture=False`).

What it cannot show: anything about the GPU itself (graph capture and
replay, stream overlap, kernel compilation for real hardware, speed), and
numerics of CUDA kernels (the CPU computes every value).

    with virtual_cuda():
        engine = InferenceEngine.from_pretrained("gpt2-tiny", device="cuda")

For a whole process tree, `python -m roseinfer.testing.virtual_cuda COMMAND...`
runs COMMAND with `process_env()`: the `site/` folder beside this file on
PYTHONPATH (its sitecustomize turns the mode on at start-up) and
ROSEINFER_VIRTUAL_CUDA=1, so every Python process the command starts runs under
it too, and every thread started afterwards. The runtime never imports this
module.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from roseinfer.testing import virtual_cuda_stubs as stubs

_TAG = "_virtual_cuda"
_PINNED = "_virtual_pinned"
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_REPO_ROOT = _PACKAGE_ROOT.parent
CUDA = torch.device("cuda", 0)


class DeviceMixError(RuntimeError):
    """What a CUDA run would have raised (or silently done slowly), found on the CPU."""


def is_cuda(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _TAG, False)


def _tag(out: Any, cuda: bool) -> None:
    if isinstance(out, torch.Tensor):
        setattr(out, _TAG, cuda)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _tag(o, cuda)


def _tensors(args: Any, kwargs: dict, found: list) -> list:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (tuple, list)) and a and isinstance(a[0], (torch.Tensor, tuple, list)):
            _tensors(a, {}, found)
    return found


def where() -> str:
    """The innermost line of project code on the stack (roseinfer, benchmarks, tests), and the
    notebook cells that led there if any (innermost first)."""
    frame, inner, cells = sys._getframe(1), None, []
    while frame is not None:
        name = frame.f_code.co_filename
        if ".ipynb" in name or "ipykernel" in name:
            cells.append(f"{name}:{frame.f_lineno}")
        elif name.startswith(str(_REPO_ROOT)) and not name.startswith(str(_PACKAGE_ROOT / "testing")):
            inner = (
                inner or f"{Path(name).relative_to(_REPO_ROOT)}:{frame.f_lineno} in {frame.f_code.co_name}"
            )
        frame = frame.f_back
    if inner and cells:
        return f"{inner} (from {' <- '.join(cells)})"
    return inner or " <- ".join(cells) or "<outside roseinfer>"


def _fail(what: str) -> None:
    raise DeviceMixError(f"virtual CUDA: {what}, at {where()}")


def _describe(ts: list[torch.Tensor]) -> str:
    return ", ".join(f"{'cuda:0' if is_cuda(t) else 'cpu'} {tuple(t.shape)}" for t in ts)


def _name(func: Any) -> str:
    owner = getattr(func, "__self__", None)
    base = getattr(func, "__name__", repr(func))
    return f"{getattr(owner, '__name__', '')}.{base}" if base in ("__get__", "__set__") else base


# Getters and setters arrive as the descriptor's __get__/__set__ method wrappers.
_DEVICE, _IS_CUDA, _IS_CPU, _DATA = (
    torch.Tensor.device,
    torch.Tensor.is_cuda,
    torch.Tensor.is_cpu,
    torch.Tensor.data,
)
# Functions that may see host and device tensors together on a real GPU.
_MIX_ALLOWED = {
    torch.Tensor.copy_,
    torch.Tensor.to,
    torch.Tensor.set_,
    torch._has_compatible_shallow_copy_type,
}


class _Mode(TorchFunctionMode):
    def __init__(self, state: _State) -> None:
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        owner = getattr(func, "__self__", None)
        if owner is not None and getattr(func, "__name__", "") in ("__get__", "__set__"):
            return self._property(func, owner, args)
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(self.state, func, args, kwargs)
        target = None  # device of the result when the call names one
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"], target = "cpu", True
        elif device is not None:
            target = False
        pinned = kwargs.pop("pin_memory", False)
        inputs = _tensors(args, kwargs, [])
        on_cuda = [t for t in inputs if is_cuda(t)]
        if target is None:
            target = bool(on_cuda)
        if on_cuda and func not in _MIX_ALLOWED:
            host = [t for t in inputs if not is_cuda(t) and t.dim() > 0]
            if host:
                _fail(f"{_name(func)} mixes devices ({_describe(inputs)})")
        _check_generator(func, args, kwargs, target)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and any(out is t and is_cuda(t) != target for t in inputs):
            out = out.clone()  # moved to another device: a new tensor, never an input retagged
        if target or on_cuda:
            _tag(out, target)
        if pinned and isinstance(out, torch.Tensor):
            setattr(out, _PINNED, True)
        return out

    def _property(self, func, owner, args):
        name = func.__name__
        if name == "__get__" and is_cuda(args[0]):
            if owner is _DEVICE:
                return CUDA
            if owner is _IS_CUDA:
                return True
            if owner is _IS_CPU:
                return False
        out = func(*args)
        if owner is _DATA:
            if name == "__set__":
                setattr(args[0], _TAG, is_cuda(args[1]))
            elif is_cuda(args[0]):
                _tag(out, True)
        return out


def _check_generator(func, args, kwargs, on_cuda: bool) -> None:
    gen = kwargs.get("generator")
    if gen is None:
        gen = next((a for a in args if isinstance(a, torch._C.Generator)), None)
    if gen is not None and (stubs.generator_device(gen).type == "cuda") != on_cuda:
        _fail(
            f"{_name(func)} on {'cuda:0' if on_cuda else 'cpu'} draws from a generator made for "
            f"{stubs.generator_device(gen)}"
        )


# -- Tensor methods that move data between devices ----------------------------------------------
def _to(state, func, args, kwargs):
    self, rest = args[0], args[1:]
    copy = kwargs.pop("copy", False)
    other = next((a for a in rest if isinstance(a, torch.Tensor)), kwargs.pop("other", None))
    if other is not None:
        target, dtype, non_blocking, fmt = (
            is_cuda(other),
            other.dtype,
            kwargs.get("non_blocking", False),
            None,
        )
    else:
        device, dtype, non_blocking, fmt = torch._C._nn._parse_to(*rest, **kwargs)
        target = is_cuda(self) if device is None else device.type == "cuda"
    moves = target != is_cuda(self)
    if moves and target:
        state.h2d_copies += 1
    options = dict(device="cpu", dtype=dtype, non_blocking=non_blocking, copy=copy or moves)
    if fmt is not None:
        options["memory_format"] = fmt
    out = func(self, **options)
    _tag(out, target)
    return out


def _cuda(state, func, args, kwargs):
    return _to(state, torch.Tensor.to, args[:1], {"device": "cuda", **kwargs})


def _cpu(state, func, args, kwargs):
    out = func(*args, **kwargs)
    if is_cuda(args[0]):
        state.synced()
        out = out.clone() if out is args[0] else out
        _tag(out, False)
    return out


def _copy(state, func, args, kwargs):
    dst, src = args[0], args[1]
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    if is_cuda(dst) and not is_cuda(src) and src.dim() > 0:
        state.h2d_copies += 1
        if non_blocking and not (src.is_contiguous() and dst.is_contiguous()):
            _fail(
                f"asynchronous host-to-device copy of a non-contiguous {'source' if not src.is_contiguous() else 'destination'} "
                f"{tuple(src.shape)}: torch stages it through an unpinned host temporary (and a device copy)"
            )
    elif is_cuda(src) and not is_cuda(dst) and dst.dim() > 0:
        state.synced()
    return func(*args, **kwargs)


def _numpy(state, func, args, kwargs):
    if is_cuda(args[0]):
        _fail("Tensor.numpy() of a CUDA tensor (can't convert cuda:0 device type tensor to numpy)")
    return func(*args, **kwargs)


def _host_sync(state, func, args, kwargs):
    if is_cuda(args[0]):
        state.synced()
    return func(*args, **kwargs)


def _pin_memory(state, func, args, kwargs):
    out = args[0].clone()
    setattr(out, _PINNED, True)
    return out


def _is_pinned(state, func, args, kwargs):
    return getattr(args[0], _PINNED, False)


def _get_device(state, func, args, kwargs):
    return 0 if is_cuda(args[0]) else -1


def _record_stream(state, func, args, kwargs):
    return None


def _untouched(state, func, args, kwargs):
    return func(*args, **kwargs)  # e.g. Module.to parsing its arguments: the device must stay "cuda"


_HANDLERS = {
    torch.Tensor.to: _to,
    torch.Tensor.cuda: _cuda,
    torch.Tensor.cpu: _cpu,
    torch.Tensor.copy_: _copy,
    torch.Tensor.numpy: _numpy,
    torch.Tensor.item: _host_sync,
    torch.Tensor.tolist: _host_sync,
    torch.Tensor.pin_memory: _pin_memory,
    torch.Tensor.is_pinned: _is_pinned,
    torch.Tensor.get_device: _get_device,
    torch.Tensor.record_stream: _record_stream,
    torch._C._nn._parse_to: _untouched,
}


# -- turning it on and off -------------------------------------------------------------------
class _State:
    def __init__(self) -> None:
        self.h2d_copies = 0  # host-to-device copies issued (tests count them per step)
        self.syncs = 0  # host syncs (synchronize, .item(), .tolist(), .cpu())
        self.kernel_launches = 0

    def synced(self) -> None:
        self.syncs += 1


_lock = threading.Lock()
_active: _State | None = None
_depth = 0
_thread_modes = threading.local()


def active() -> bool:
    return _active is not None


def stats() -> SimpleNamespace:
    """Counters of the active session (a snapshot)."""
    assert _active is not None, "virtual CUDA is not active"
    return SimpleNamespace(**vars(_active))


def enable() -> None:
    """Turn the mode on for this thread and every thread started from now on (nests)."""
    global _active, _depth
    with _lock:
        if _depth == 0:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # kernels defined from now on are interpreted
            _active = _State()
            stubs.install(_active, _fail, is_cuda)
            _wrap_threads()
        _depth += 1
    _enter_thread()


def disable() -> None:
    global _active, _depth
    _exit_thread()
    with _lock:
        _depth -= 1
        if _depth == 0:
            stubs.uninstall()
            _unwrap_threads()
            _active = None


@contextlib.contextmanager
def virtual_cuda() -> Iterator[SimpleNamespace]:
    enable()
    try:
        yield _active
    finally:
        disable()


def _enter_thread() -> None:
    stack = getattr(_thread_modes, "stack", None)
    if stack is None:
        stack = _thread_modes.stack = []
    if stack:  # nested: one mode per thread, or every op would be rewritten twice
        stack.append(None)
        return
    mode = _Mode(_active)
    mode.__enter__()
    stack.append(mode)


def _exit_thread() -> None:
    mode = _thread_modes.stack.pop()
    if mode is not None:
        mode.__exit__(None, None, None)


_original_bootstrap = threading.Thread._bootstrap_inner


def _bootstrap_inner(self) -> None:
    if active():
        _enter_thread()
    _original_bootstrap(self)


def _wrap_threads() -> None:
    threading.Thread._bootstrap_inner = _bootstrap_inner


def _unwrap_threads() -> None:
    threading.Thread._bootstrap_inner = _original_bootstrap


SITE_DIR = Path(__file__).with_name("site")


def process_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with virtual CUDA on for every Python process started with it."""
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), path] if path else [str(SITE_DIR)])
    env["ROSEINFER_VIRTUAL_CUDA"] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    """Run a command with virtual CUDA on in it and in every Python process it starts."""
    import subprocess

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m roseinfer.testing.virtual_cuda COMMAND [ARGS...]", file=sys.stderr)
        return 2
    return subprocess.call(argv, env=process_env())


if __name__ == "__main__":
    raise SystemExit(main())
