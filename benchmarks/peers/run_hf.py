"""Hugging Face transformers `generate` (one static, left-padded batch), in the project's virtualenv; any
architecture transformers knows (GPT-2, Llama, Qwen2)."""

from __future__ import annotations

import torch
import transformers
from harness.hf_peer import run_hf_generate
from runner_io import Requests, run

from roseinfer.bench.workloads import BenchRequest


def load(spec):
    torch.set_num_threads(spec["threads"])
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()

    def generate(requests: Requests) -> list[list[int]]:
        return run_hf_generate(model, [BenchRequest(r["prompt"], r["max_new_tokens"]) for r in requests])

    return generate, {"transformers": transformers.__version__, "torch": torch.__version__}


if __name__ == "__main__":
    run(load)
