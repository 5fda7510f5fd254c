"""Checks for the notebooks' write-the-code exercises: each runs the reader's function against a small test and
prints one line, PASS or what failed. One module per notebook's exercise, named for its topic; the notebooks import
the checks from here. The solutions live in `roseinfer.bench.solutions`, out of the notebook."""

from roseinfer.bench.exercises.accessors import check_generated_ids
from roseinfer.bench.exercises.batching import check_pack_batch
from roseinfer.bench.exercises.bf16_packing import check_pack_panels
from roseinfer.bench.exercises.continuous_batching import (
    SCHEDULE_MAX_BATCH_SIZES,
    _schedule_states,
    _schedule_stream,
    check_schedule_step,
)
from roseinfer.bench.exercises.gqa import check_gqa_decode
from roseinfer.bench.exercises.graph_bucket import check_graph_bucket
from roseinfer.bench.exercises.kv_cache import check_kv_cache_attention
from roseinfer.bench.exercises.lookups import check_collect_step_records
from roseinfer.bench.exercises.manager import (
    WORKER_SCRIPT,
    _run_worker_script,
    _ScriptedRequest,
    _ScriptedScheduler,
    check_worker_pass,
)
from roseinfer.bench.exercises.paged_attention import check_paged_decode
from roseinfer.bench.exercises.prefix_cache import check_prefix_blocks
from roseinfer.bench.exercises.router import check_prefix_router
from roseinfer.bench.exercises.sse import check_frame_stream
from roseinfer.bench.exercises.wakeup import check_worker_idle

# The underscored names and the scripts are the checks' insides, re-exported for tests/test_exercises.py.
__all__ = [
    "SCHEDULE_MAX_BATCH_SIZES",
    "WORKER_SCRIPT",
    "_ScriptedRequest",
    "_ScriptedScheduler",
    "_run_worker_script",
    "_schedule_states",
    "_schedule_stream",
    "check_collect_step_records",
    "check_frame_stream",
    "check_generated_ids",
    "check_gqa_decode",
    "check_graph_bucket",
    "check_kv_cache_attention",
    "check_pack_batch",
    "check_pack_panels",
    "check_paged_decode",
    "check_prefix_blocks",
    "check_prefix_router",
    "check_schedule_step",
    "check_worker_idle",
    "check_worker_pass",
]
