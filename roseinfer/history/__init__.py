"""Earlier versions of roseinfer's components, kept runnable for the notebooks.

Each module is named for the notebook that retires it and holds a small
subclass or strategy that overrides only what that notebook's increment
changed; everything else is today's code. Before and after give the same
greedy tokens, and the notebooks assert it.

    notebook 02  one_request       OneRequestGenerator    one request at a time, prefill to last token
    notebook 03  static_batching   StaticBatchGenerator   static batches, padded to the longest
    notebook 03  static_scheduler  StaticBatchScheduler   the same policy as a scheduler (diffed in 03)
    notebook 04  no_manager        NoManager              one request at a time under a global lock
    notebook 04  first_manager     FirstManager           04's manager: 05-07's changes taken back out
    notebook 05  polling_worker    PollingWorkerManager   idle worker polls every 5 ms
    notebook 06  private_state     PrivateStateManager    reads scheduler internals
    notebook 07  lock_per_token    LockPerTokenManager    one lock acquisition per token
    notebook 10  no_prefix_cache   NoPrefixCacheScheduler every prompt computed from its first token

`make_manager(name, engine, **options)` builds any manager variant by name;
the benchmarks (`--variant`) use it. The server always runs SchedulerManager
and never imports this package.

`TEACHING_SEAMS` names every production function, method or class whose
source a notebook or a test prints or diffs (`show_diff`, `show_source`,
`show_branch_diff`, `source_diff`, `inspect.getsource`): renaming or moving
one breaks tests/test_teaching_seams.py by name, and its notebook needs
re-executing.
"""

from __future__ import annotations

from typing import Any

from roseinfer.engine.engine import InferenceEngine
from roseinfer.history.first_manager import FirstManager
from roseinfer.history.lock_per_token import LockPerTokenManager
from roseinfer.history.no_manager import NoManager
from roseinfer.history.polling_worker import PollingWorkerManager
from roseinfer.history.private_state import PrivateStateManager
from roseinfer.server.manager import Manager, SchedulerManager

TEACHING_SEAMS: list[str] = [
    # notebook 03: the scheduler's step plan (admission and finishing)
    "roseinfer.engine.scheduler.OnlineScheduler.schedule",
    "roseinfer.engine.scheduler.OnlineScheduler._schedule_admissions",
    "roseinfer.engine.scheduler.OnlineScheduler._finish",
    # notebook 04: the worker thread
    "roseinfer.server.manager.SchedulerManager._worker_loop",
    # notebook 05 and tests/test_bench.py: the idle wait
    "roseinfer.server.manager.SchedulerManager._idle",
    "roseinfer.server.manager.SchedulerManager._wait_for_work",
    # notebook 06: public accessors instead of scheduler internals
    "roseinfer.server.manager.SchedulerManager._pop_finished",
    "roseinfer.engine.scheduler.OnlineScheduler.get_generated_ids",
    "roseinfer.engine.scheduler.OnlineScheduler.get_step_count",
    "roseinfer.engine.scheduler.OnlineScheduler.pop_response",
    # notebook 07 and tests/test_bench.py: one lock per step
    "roseinfer.server.manager.SchedulerManager._collect_step_records",
    # notebook 08: the paged attention backends and the Triton kernel
    "roseinfer.attention.torch_ref.TorchPagedAttention.forward",
    "roseinfer.attention.cpu.CpuPagedAttention.forward",
    "roseinfer.kernels.triton.paged_attention._paged_decode_kernel.fn",
    # notebook 09: the layers in one C call (CPU), the runner's graph branch and the replay (GPU)
    "roseinfer.models.gpt2.GPT2.forward",
    "roseinfer.models.fused_decode.FusedDecode.run",
    "roseinfer.engine.runner.ModelRunner.execute",
    "roseinfer.engine.cuda_graphs.DecodeGraphs.run",
    # notebook 10 and tests/test_history.py: admission with the prefix cache
    "roseinfer.engine.scheduler.OnlineScheduler._admit",
    "roseinfer.engine.block_manager.BlockManager.match_prefix",
    "roseinfer.engine.scheduler.OnlineScheduler._register_full_blocks",
    # notebook 13: the completions route
    "roseinfer.server.routes_completions.completions",
    # notebook 11: the dtype choice and the bf16 kernel's branch
    "roseinfer.config.resolve_dtype",
    "roseinfer.models.packed_linear.PackedLinear.forward",
    "roseinfer.models.packed_linear.bf16_kernel_wanted",
    # notebook 14: the load report a gateway routes on
    "roseinfer.server.loads.load_report",
    # notebook 12: q, k and v of grouped-query attention; GPT-2's attention against Llama's (show_diff)
    "roseinfer.models.llama.Attention.forward",
    "roseinfer.models.gpt2.CausalSelfAttention",
    "roseinfer.models.llama.Attention",
]

MANAGER_VARIANTS: dict[str, type[Manager]] = {
    "current": SchedulerManager,
    "no-manager": NoManager,
    "polling": PollingWorkerManager,
    "private-state": PrivateStateManager,
    "lock-per-token": LockPerTokenManager,
    "first-manager": FirstManager,
}


def make_manager(name: str, engine: InferenceEngine, **options: Any) -> Manager:
    try:
        cls = MANAGER_VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown manager variant {name!r}; choose from {', '.join(MANAGER_VARIANTS)}"
        ) from None
    return cls(engine, **options)
