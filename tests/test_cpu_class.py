"""roseinfer.cpu_class: a wider CPU standing in for a narrower class's instruction set."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from roseinfer import config
from roseinfer.cpu_class import CLASSES, class_env
from roseinfer.cpu_class.__main__ import main
from roseinfer.kernels.cpu.bindings import load_f32_linear_kernel


def test_each_class_caps_aten_onednn_and_roseinfers_kernels():
    env = class_env("avx2")
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2",
                   "ROSEINFER_KERNEL_MARCH": "x86-64-v3", "ROSEINFER_CPU_CLASS": "avx2"}
    assert all(set(class_env(name)) == set(env) for name in CLASSES)
    with pytest.raises(ValueError, match="unknown CPU class 'sse2'"):
        class_env("sse2")


def test_under_a_class_roseinfer_answers_for_it(monkeypatch):
    monkeypatch.setenv("ROSEINFER_CPU_CLASS", "avx2")
    assert not config.native_bf16_cpu() and not config.amx_bf16_cpu()  # so fp32 by default, no bf16 kernel
    monkeypatch.setenv("ROSEINFER_CPU_CLASS", "zen9")
    with pytest.raises(ValueError, match="ROSEINFER_CPU_CLASS='zen9'"):
        config.native_bf16_cpu()


def test_without_a_command_it_prints_the_settings(capsys):
    assert main(["avx2"]) == 0
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in capsys.readouterr().out


PROBE = """
import json, torch
from roseinfer.kernels.cpu.bindings import load_bf16_linear_kernel, load_f32_linear_kernel
from roseinfer.bench.results import cpu_info
from roseinfer.config import resolve_dtype
print(json.dumps({"columns": load_f32_linear_kernel().linear_f32_panel_columns(),
                  "bf16_kernel": load_bf16_linear_kernel() is not None,
                  "dtype": str(resolve_dtype("auto", torch.device("cpu"))),
                  "aten": torch.backends.cpu.get_cpu_capability(),
                  "emulated": cpu_info()["emulated_class"]}))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the classes are x86's")
@pytest.mark.skipif(load_f32_linear_kernel() is None, reason="no C compiler: no kernels to build for a class")
def test_the_avx2_class_runs_the_avx2_kernels_in_a_child(monkeypatch):
    monkeypatch.delenv("ROSEINFER_CPU_DTYPE", raising=False)  # the class's own default dtype
    run = subprocess.run([sys.executable, "-m", "roseinfer.cpu_class", "avx2", "--", sys.executable, "-c", PROBE],
                         capture_output=True, text=True, timeout=300, check=True)
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # two 256-bit vectors a panel, no AVX512-BF16 kernel, fp32 by default, ATen at AVX2, and the results say so
    assert seen == {"columns": 16, "bf16_kernel": False, "dtype": "torch.float32", "aten": "AVX2",
                    "emulated": "avx2"}


def test_a_class_run_writes_its_results_apart(monkeypatch, tmp_path):
    from roseinfer.bench.results import results_dir

    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("ROSEINFER_CPU_CLASS", raising=False)
    assert results_dir("cpu").name == "cpu"
    monkeypatch.setenv("ROSEINFER_CPU_CLASS", "avx2")
    assert results_dir("cpu").name == "cpu-avx2"  # never over, or beside, the machine's own figures


def test_peers_that_cannot_be_capped_are_skipped_under_a_class(monkeypatch, tmp_path):
    from roseinfer.bench.peers import ENGINES

    monkeypatch.delenv("ROSEINFER_CPU_CLASS", raising=False)
    assert ENGINES["llamacpp-f32"].missing(tmp_path).startswith(f"{tmp_path / 'llamacpp'} is not installed")
    monkeypatch.setenv("ROSEINFER_CPU_CLASS", "avx2")
    assert "cannot be held to the emulated avx2 class" in ENGINES["vllm-fp32"].missing(tmp_path)
    assert ENGINES["roseinfer-int8"].missing(tmp_path) is None  # roseinfer's and CTranslate2's are capped
