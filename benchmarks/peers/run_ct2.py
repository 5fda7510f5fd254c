"""CTranslate2's `Generator`, in .peers/ct2 (see runner_io.py).

CTranslate2 batches statically: one `generate_batch` call runs every request
to the longest one's length and each result is cut to its own length (only
those tokens count as output). It takes prompts as token strings, looked up
in the converted model's vocabulary. An empty `end_token` list means no token
ends a sequence: EOS is an ordinary token here, as for the other engines.
"""

from __future__ import annotations

import json
from pathlib import Path

import ctranslate2
from runner_io import Requests, run


def load(spec):
    options = spec["options"]
    generator = ctranslate2.Generator(
        spec["model"],
        device="cpu",
        compute_type=options["compute_type"],
        intra_threads=spec["threads"],
        inter_threads=1,
    )
    vocabulary = json.loads((Path(spec["model"]) / "vocabulary.json").read_text())

    def generate(requests: Requests) -> list[list[int]]:
        results = generator.generate_batch(
            [[vocabulary[i] for i in r["prompt"]] for r in requests],
            max_length=max(r["max_new_tokens"] for r in requests),
            sampling_topk=1,
            end_token=[],
            include_prompt_in_result=False,
        )
        return [res.sequences_ids[0][: r["max_new_tokens"]] for res, r in zip(results, requests)]

    return generate, {"ctranslate2": ctranslate2.__version__, "compute_type": options["compute_type"]}


if __name__ == "__main__":
    run(load)
