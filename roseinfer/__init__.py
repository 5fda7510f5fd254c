"""roseinfer: a GPT-2 inference engine and OpenAI-compatible server, built from scratch."""

import os

if os.environ.get("ROSEINFER_VIRTUAL_CUDA") == "1":
    # CUDA branches on CPU tensors tagged as CUDA, for this process and its threads (and, through
    # the environment, its child processes): see roseinfer.testing.virtual_cuda.
    from roseinfer.testing import virtual_cuda

    virtual_cuda.enable()

from roseinfer.config import PRESETS, EngineConfig, ModelConfig
from roseinfer.engine.engine import InferenceEngine
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.engine.sequence import GenerationOutput
from roseinfer.errors import InvalidRequestError
from roseinfer.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "EngineConfig",
    "GenerationOutput",
    "InferenceEngine",
    "InvalidRequestError",
    "ModelConfig",
    "OnlineScheduler",
    "SamplingParams",
]
