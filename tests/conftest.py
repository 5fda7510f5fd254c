"""Shared fixtures: a small GPT-2 in Hugging Face format, and engines over it.

Standard GPT-2 initialisation makes a random model repeat one token forever,
which would make "same tokens" tests pass trivially. The tiny reference model
here has its projections scaled up so that greedy decoding wanders through the
vocabulary, and HF `GPT2LMHeadModel` on the very same weights is the oracle.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

# Tests (and the notebooks nbval runs in the same session) never reach the real
# Hub: unless a test serves its own endpoint (tests/hub_server.py), Hub look-ups
# go to a closed local port and fail at once, so the weights are the same on
# every machine. roseinfer.hub reads HF_ENDPOINT at call time.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
# "auto" would be bf16 on CPUs with native bf16 and fp32 elsewhere; the suite and
# the notebooks compare exact fp32 tokens on every CPU (bf16 is tested by name).
os.environ.setdefault("ROSEINFER_CPU_DTYPE", "float32")

if not torch.cuda.is_available():
    # Triton kernels run on CPU tensors through its interpreter; it must be on
    # before the first kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from roseinfer import InferenceEngine
from roseinfer.bench.same_answer import transformers_greedy

TINY_HF_CONFIG = dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)
PROJECTION_SCALE = 5.0


def build_hf_tiny(seed: int = 0, **overrides):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**{**TINY_HF_CONFIG, **overrides})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".c_" in name and name.endswith("weight"):
                param.mul_(PROJECTION_SCALE)
    return model


@pytest.fixture(scope="session")
def hf_tiny_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf-tiny")
    build_hf_tiny().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hf_model(hf_tiny_dir):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(hf_tiny_dir).eval()


@pytest.fixture(scope="session")
def engine(hf_tiny_dir) -> InferenceEngine:
    return InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=256)


@pytest.fixture
def make_engine(hf_tiny_dir):
    def make(**config) -> InferenceEngine:
        return InferenceEngine.from_pretrained(str(hf_tiny_dir), **config)

    return make


# Greedy decoding by full recomputation with HF: the simplest possible oracle.
hf_greedy = transformers_greedy


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.INFO, logger="roseinfer")


@pytest.fixture
def virtual_cuda():
    """Run the test's CUDA branch on CPU tensors tagged as CUDA (roseinfer.testing.virtual_cuda)."""
    from roseinfer.testing.virtual_cuda import virtual_cuda as mode

    if torch.cuda.is_available():
        pytest.skip("a real GPU is here: the native tests run the CUDA branches")
    with mode() as state:
        yield state


@pytest.fixture(params=["native", "virtual-cuda"])
def engine_device(request):
    """The device to build an engine on: this machine's ("cuda" where there is one), then the CUDA
    branch on CPU tensors tagged as CUDA (whose default dtype, like a GPU's, is bf16)."""
    if request.param == "native":
        yield "cuda" if torch.cuda.is_available() else "cpu"
        return
    from roseinfer.testing.virtual_cuda import virtual_cuda as mode

    if torch.cuda.is_available():
        pytest.skip("a real GPU is here: the native run covers CUDA")
    with mode():
        yield "cuda"
