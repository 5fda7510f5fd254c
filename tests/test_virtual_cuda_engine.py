"""The engine's CUDA branches, run under virtual CUDA (CPU tensors tagged as CUDA).

Both attention backends, with and without the padded graph path, give the
exact fp32 CPU engine's tokens, greedy and seeded; any tensor, index or
generator left on the wrong device fails the run with the roseinfer line.
(Chunked prefill and prefix-cache hits on the CUDA branch: test_kernels.py,
whose engine test also runs under virtual CUDA.)

Seeded sampling equals the CPU's here only because a virtual CUDA generator
draws the CPU's random stream; on a GPU the stream differs, so there only
reproducibility from a seed can be compared.
"""

from __future__ import annotations

import pytest

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.kernels.triton import triton_available

PROMPTS = ["Virtual CUDA runs", "every branch", "東京 🙂", "of the engine on a CPU " * 3]
GREEDY = SamplingParams(max_new_tokens=5, stop_on_eos=False)
SEEDED = SamplingParams(max_new_tokens=5, stop_on_eos=False, temperature=0.9, top_k=40, top_p=0.95, seed=11)
VARIANTS = {
    "torch": dict(attention_backend="torch", cuda_graph=False),
    "triton": dict(attention_backend="triton", cuda_graph=False),
    "triton+graphs": dict(attention_backend="triton", cuda_graph=True),
}


@pytest.fixture(scope="module")
def cpu_reference(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    return {
        "greedy": [o.token_ids for o in engine.generate(PROMPTS, GREEDY)],
        "seeded": [o.token_ids for o in engine.generate(PROMPTS, SEEDED)],
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_engine_gives_the_cpu_fp32_tokens(variant, hf_tiny_dir, cpu_reference, virtual_cuda):
    if VARIANTS[variant]["attention_backend"] == "triton" and not triton_available():
        pytest.skip("triton is not installed")
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir),
        device="cuda",
        dtype="float32",
        num_kv_blocks=64,
        max_batch_size=6,
        **VARIANTS[variant],
    )
    assert engine.describe()["device"] == "cuda" and engine.runner.kv_cache.is_cuda
    assert engine.describe()["cuda_graph"] is VARIANTS[variant]["cuda_graph"]
    launches = virtual_cuda.kernel_launches
    assert [o.token_ids for o in engine.generate(PROMPTS, GREEDY)] == cpu_reference["greedy"]
    assert [o.token_ids for o in engine.generate(PROMPTS, SEEDED)] == cpu_reference["seeded"]
    assert (virtual_cuda.kernel_launches > launches) == (VARIANTS[variant]["attention_backend"] == "triton")
    if engine.runner.graphs is not None:
        assert not engine.runner.graphs.captured  # nothing to capture on a CPU: the padded path ran
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_cuda_default_bf16_graph_path_equals_bf16_eager(hf_tiny_dir, virtual_cuda):
    """CUDA's default dtype is bf16: compared with bf16 eager, never with the fp32 CPU tokens."""
    make = lambda graphs: InferenceEngine.from_pretrained(  # noqa: E731
        str(hf_tiny_dir), device="cuda", num_kv_blocks=32, max_batch_size=4, cuda_graph=graphs
    )
    graphs, eager = make(True), make(False)
    assert str(graphs.dtype) == "torch.bfloat16" and graphs.runner.graphs is not None
    prompts, params = PROMPTS[:3], SamplingParams(max_new_tokens=4, stop_on_eos=False)
    assert [o.token_ids for o in graphs.generate(prompts, params)] == [
        o.token_ids for o in eager.generate(prompts, params)
    ]


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_gpu_check_runs_at_tiny_sizes(virtual_cuda, monkeypatch, tmp_path):
    """benchmarks/gpu_check.py, every part, on virtual CUDA: its token checks must hold; its timings
    are of a CPU and only show that the timing code runs."""
    import json
    import sys

    from roseinfer.bench.results import REPO_ROOT

    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    sys.modules.pop("gpu_check", None)
    import gpu_check

    assert gpu_check.main(["--tiny"]) == 0
    [written] = tmp_path.glob("tiny/*/gpu_check.json")
    metrics = json.loads(written.read_text())["metrics"]
    checks = metrics["tokens"]["gpt2-tiny"]
    assert all(checks[name]["equal_to_cpu"] for name in checks if name.startswith("cuda_fp32"))
    assert checks["bf16_graph_equals_eager"]["equal"]
    assert {r["variant"] for r in metrics["steps"]["rows"]} == {
        "triton_graphs",
        "triton_eager",
        "torch_eager",
    }
    assert metrics["offline"]["output_tok_s"] > 0


def test_a_reintroduced_host_generator_fails_the_cuda_run(hf_tiny_dir, monkeypatch, virtual_cuda):
    """The suite is not blind: a seeded request given a CPU generator on a CUDA engine fails, naming
    the line in roseinfer that draws from it."""
    import torch

    from roseinfer.testing.virtual_cuda import DeviceMixError

    monkeypatch.setattr(
        SamplingParams, "make_generator", lambda self, device: torch.Generator().manual_seed(1)
    )
    engine = InferenceEngine.from_pretrained(
        str(hf_tiny_dir), device="cuda", dtype="float32", num_kv_blocks=16, attention_backend="torch"
    )
    with pytest.raises(DeviceMixError, match=r"generator made for cpu, at roseinfer/sampling.py:\d+"):
        engine.generate(PROMPTS[:1], SEEDED)
