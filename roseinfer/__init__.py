"""roseinfer: a GPT-2 inference engine and OpenAI-compatible server, built from scratch."""

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
