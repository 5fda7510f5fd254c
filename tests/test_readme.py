"""The README's figures are rendered from results/, not typed: they must be up to date."""

from harness.readme import render_readme

from roseinfer.bench.results import repo_root


def test_readme_results_sections_match_results_files():
    text = (repo_root(__file__) / "README.md").read_text()
    assert render_readme(text) == text, "run: python benchmarks/update_readme.py"


def _gpu_run(tokens_equal: bool, tiny: bool = False) -> dict:
    variants = ("cuda_fp32_triton_graphs", "cuda_fp32_triton_eager", "cuda_fp32_torch")
    checks = {v: {"equal_to_cpu": tokens_equal or v != variants[0]} for v in variants}
    checks["bf16_graph_equals_eager"] = {"equal": True}
    rows = [
        {"variant": v, "batch": b, "context": c, "step_ms": 1.0 + b / 100, "floor_ms": 0.1}
        for v in ("torch_eager", "triton_eager", "triton_graphs") for b in (1, 8) for c in (128, 512, 1000)
    ]
    return {"device": "h200", "device_name": "NVIDIA H200", "torch_version": "2.x", "date": "2026-11-28T00:00:00",
            "config": {"tiny": tiny}, "metrics": {"tokens": {"gpt2": checks}, "steps": {"rows": rows}}}


def test_gpu_section_says_which_variants_kept_the_cpu_tokens_and_skips_tiny_runs(tmp_path):
    from harness.readme import gpu_check_section

    from roseinfer.bench.results import write_json

    assert gpu_check_section(tmp_path).startswith("_no GPU run")
    write_json(tmp_path / "h200" / "gpu_check.json", _gpu_run(tokens_equal=False))
    text = gpu_check_section(tmp_path)
    assert "gpt2 2/3" in text and "NVIDIA H200, 2026-11-28" in text
    # the shortest and the longest context only: 2 batches x 2 contexts
    assert text.count("| batch ") == 4 and "context 512" not in text
    write_json(tmp_path / "h200" / "gpu_check.json", _gpu_run(tokens_equal=True, tiny=True))
    assert gpu_check_section(tmp_path).startswith("_no GPU run")  # CI-size numbers never reach the README
