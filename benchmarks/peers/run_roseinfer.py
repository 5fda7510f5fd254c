"""roseinfer through its public API, in the project's virtualenv (see runner_io.py)."""

from __future__ import annotations

import torch
from runner_io import Requests, run

import roseinfer
from roseinfer import InferenceEngine
from roseinfer.models import packed_linear
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
    versions = {"roseinfer": roseinfer.__version__, "torch": torch.__version__, "dtype": dtype}
    if dtype == "float32":  # the kernel choices this process's probe made (models/packed_linear.py)
        kernel, rows = packed_linear.fp32_small_rows()
        versions["fp32_kernels"] = (f"{kernel} up to {rows} rows, one-call decode steps up to "
                                    f"{packed_linear.fp32_fused_rows()} rows, oneDNN past them")
    return generate, versions


if __name__ == "__main__":
    run(load)
