"""release_openmp_workers frees the libgomp torch itself links, found by the name torch's library records.

A torch wheel may ship its libgomp renamed (`torch.libs/libgomp-<hash>.so.1`) while a system
libgomp.so.1 is loaded too; pausing the first libgomp mapping of the process then frees nothing of
torch's. Here a stand-in "torch" library links a stand-in renamed libgomp that counts its pauses.
"""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess

import pytest

from roseinfer.engine import openmp

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-ins")

HASHED = "libgomp-0a1b2c3d.so.1"


def _shared(tmp_path, name, code, *link):
    src = tmp_path / f"{name}.c"
    src.write_text(code)
    out = tmp_path / name
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(out), str(src), *link], check=True)
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openmp")
    gomp = _shared(tmp, HASHED, "int pauses;\nint omp_pause_resource_all(int kind) { ++pauses; return 0; }\n")
    fake_torch = _shared(tmp, "libtorch_cpu.so", "int torch_marker(void) { return 1; }\n",
                         "-Wl,--no-as-needed", f"-L{tmp}", f"-l:{HASHED}")
    plain = _shared(tmp, "libtorch_without_gomp.so", "int torch_marker(void) { return 2; }\n")
    gomp_lib = ctypes.CDLL(str(gomp))  # loaded first, as the wheel's loader does it: the torch stand-in finds it
    ctypes.CDLL(str(fake_torch))
    return fake_torch, plain, ctypes.c_int.in_dll(gomp_lib, "pauses")


def test_the_libgomp_torch_links_is_read_from_its_library(stand_ins):
    fake_torch, plain, _ = stand_ins
    assert openmp.torch_openmp_runtime(str(fake_torch)) == HASHED
    assert openmp.torch_openmp_runtime(str(plain)) is None
    assert openmp.elf_needed("/no/such/library.so") == []


def test_the_renamed_libgomp_torch_links_is_the_one_paused(stand_ins):
    fake_torch, _, pauses = stand_ins
    before = pauses.value
    assert openmp.release_openmp_workers(str(fake_torch))
    assert pauses.value == before + 1  # torch's (renamed) copy, not the first libgomp of the process


def test_a_torch_without_libgomp_frees_none_and_says_so(stand_ins, caplog):
    _, plain, pauses = stand_ins
    before = pauses.value
    with caplog.at_level(logging.INFO, logger="roseinfer.engine"):
        assert not openmp.release_openmp_workers(str(plain))
    assert pauses.value == before and "no worker pool freed" in caplog.text
