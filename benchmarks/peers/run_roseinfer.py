"""roseinfer through its public API, in the project's virtualenv (see runner_io.py)."""

from __future__ import annotations

import torch
from runner_io import Requests, run

import roseinfer
from roseinfer import InferenceEngine
from roseinfer.sampling import SamplingParams


def load(spec):
    torch.set_num_threads(spec["threads"])
    # dtype None lets the engine pick for this processor (the "auto" variant); quantization: the int8 variant.
    options = spec["options"]
    engine = InferenceEngine.from_pretrained(spec["model"], dtype=options.get("dtype"),
                                             quantization=options.get("quantization"))

    def generate(requests: Requests) -> list[list[int]]:
        params = [SamplingParams(max_new_tokens=r["max_new_tokens"], stop_on_eos=False) for r in requests]
        outs = engine.generate([r["prompt"] for r in requests], params, max_batch_size=len(requests))
        return [o.token_ids for o in outs]

    dtype = "int8" if engine.config.quantization else str(engine.dtype).removeprefix("torch.")
    return generate, {"roseinfer": roseinfer.__version__, "torch": torch.__version__, "dtype": dtype}


if __name__ == "__main__":
    run(load)
