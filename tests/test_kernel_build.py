"""The CPU kernels' build: its cache key, its cache directory, and its fallbacks."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest
from test_attention import build_case, contiguous_reference

from roseinfer.attention.cpu import CpuPagedAttention
from roseinfer.kernels.cpu import bindings, build

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

NEOVERSE_N1 = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
# Neoverse V1: the same vendor, more features (SVE), another part number.
NEOVERSE_V1 = NEOVERSE_N1.replace("asimddp", "asimddp sve svebf16 i8mm bf16").replace("0xd0c", "0xd40")


@pytest.fixture
def tiny_source(tmp_path):
    source = tmp_path / "tiny.c"
    source.write_text("int tiny(void) { return 42; }\n")
    return source


def key(source, compiler="cc", version="gcc 12"):
    return build.cache_path(source, compiler, version, build.flag_sets()[0]).name


def test_the_cache_key_tells_arm_cpus_apart(tiny_source, tmp_path, monkeypatch):
    monkeypatch.setattr(build, "native_target", lambda compiler: "")  # only what /proc/cpuinfo says
    keys = []
    for text in (NEOVERSE_N1, NEOVERSE_V1):  # no "model name" or "flags" line on ARM
        (tmp_path / "cpuinfo").write_text(text)
        monkeypatch.setattr(build, "CPUINFO", tmp_path / "cpuinfo")
        keys.append(key(tiny_source))
    assert keys[0] != keys[1]


def test_the_cache_key_holds_the_local_headers_a_source_includes(tmp_path):
    (tmp_path / "shared.h").write_text("#define ANSWER 42\n")
    source = tmp_path / "uses.c"
    source.write_text('#include "shared.h"\nint answer(void) { return ANSWER; }\n')
    before = key(source)
    (tmp_path / "shared.h").write_text("#define ANSWER 43\n")  # a kernel built on the old header is stale
    assert key(source) != before


def test_the_cache_key_holds_the_architecture_and_the_compiler(tiny_source, monkeypatch):
    monkeypatch.setattr(build, "native_target", lambda compiler: "")
    monkeypatch.setattr(build, "CPUINFO", Path("/no/such/cpuinfo"))
    monkeypatch.setattr(build.platform, "processor", lambda: "")
    by_machine = set()
    for machine in ("x86_64", "aarch64"):
        monkeypatch.setattr(build.platform, "machine", lambda machine=machine: machine)
        by_machine.add(key(tiny_source))
    assert len(by_machine) == 2
    assert key(tiny_source, "/usr/bin/gcc") != key(tiny_source, "/usr/bin/clang")  # same version text
    assert key(tiny_source, version="gcc 12") != key(tiny_source, version="gcc 13")


def test_the_cache_needs_no_home_when_its_directory_is_set(monkeypatch, tmp_path):
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(build.Path, "home", no_home)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    assert build.kernel_cache_dir() == tmp_path / "kernels"
    monkeypatch.delenv("ROSEINFER_KERNEL_CACHE")
    fallback = build.kernel_cache_dir()  # neither: the temp directory, one per user
    assert fallback.name.startswith("roseinfer-kernels-")


@needs_cc
def test_a_damaged_cached_library_is_rebuilt(tiny_source, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("CC", shutil.which("cc"))
    found = build._compiler()
    cached = build.cache_path(tiny_source, *found, build.flag_sets()[0])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"\x7fELF cut short by a full disk")
    with caplog.at_level(logging.WARNING, logger="roseinfer.kernels"):
        lib = build.load_kernel_library(tiny_source, "tiny", "nothing")
    assert lib is not None and lib.tiny() == 42
    assert "building it again" in caplog.text and "one thread" not in caplog.text  # the OpenMP build, rebuilt
    assert cached.read_bytes()[:4] == b"\x7fELF" and cached.stat().st_size > 100


@needs_cc
def test_a_compiler_refusing_march_native_builds_a_portable_library(tiny_source, tmp_path, monkeypatch, caplog):
    cc = tmp_path / "cc-without-native"
    cc.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && exit 1; done\nexec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    with caplog.at_level(logging.WARNING, logger="roseinfer.kernels"):
        lib = build.load_kernel_library(tiny_source, "tiny", "nothing")
    assert lib is not None and lib.tiny() == 42
    assert "refuses -march=native" in caplog.text and "one thread" not in caplog.text


def _gcc() -> str | None:
    cc = shutil.which("cc")
    if cc is None:
        return None
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    return cc if "gcc" in version.lower() or "free software foundation" in version.lower() else None


@pytest.mark.skipif(_gcc() is None, reason="the vectorization report read here is gcc's")
def test_the_softmax_exponentials_vectorize_on_avx2(tmp_path):
    source = bindings.PAGED_DECODE_SOURCE
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1) if "scores[i] = exp_neg(" in text)
    report = subprocess.run(
        [_gcc(), "-O3", "-march=haswell", "-fopenmp-simd", "-shared", "-fPIC", "-fopt-info-vec-optimized",
         "-o", str(tmp_path / "avx2.so"), str(source)],
        capture_output=True, text=True, check=True,
    ).stderr
    assert f"paged_decode.c:{line}:" in report  # the loop of a block's exponentials, in 256-bit vectors


@pytest.mark.skipif(_gcc() is None or "avx2" not in build.cpu_signature(), reason="needs gcc and an AVX2 CPU")
def test_an_avx2_build_of_the_attention_kernel_is_exact(tmp_path, monkeypatch):
    cc = tmp_path / "cc-avx2"  # -march=native replaced by AVX2 alone: the kernel as an AVX2-only CPU builds it
    cc.write_text('#!/bin/sh\nfor a; do shift; [ "$a" = -march=native ] && a=-march=haswell; set -- "$@" "$a"; '
                  'done\nexec cc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("ROSEINFER_KERNEL_CACHE", str(tmp_path / "kernels"))
    bindings.load_paged_decode_kernel.cache_clear()
    try:
        backend = CpuPagedAttention(num_threads=2)
        assert backend.fused
        q, k, v, k_cache, v_cache, meta, seqs = build_case([(300, 1), (37, 1), (1, 1)], 16)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
        assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5
    finally:
        bindings.load_paged_decode_kernel.cache_clear()
