"""llama.cpp through llama-cpp-python's low-level API, in .peers/llamacpp (see runner_io.py).

llama-cpp-python's `Llama` object decodes one sequence at a time; llama.cpp
itself batches many sequences into one `llama_decode` (each token tagged with
its sequence id, all sharing one unified KV cache). So this runner drives the
C API directly: every request is admitted at once, each step feeds the
pending tokens of every running sequence (prompts in chunks of up to n_batch
tokens, then one token per sequence), asks for logits only at each sequence's
last token, and takes the argmax (greedy; EOS is just a token here).
"""

from __future__ import annotations

import llama_cpp as ll
import numpy as np
from runner_io import Requests, run

N_BATCH = 512  # tokens per llama_decode call (prompt chunks)


def load(spec):
    longest_workload = max(
        sum(len(r["prompt"]) + r["max_new_tokens"] for r in reqs) for reqs in spec["workloads"].values()
    )
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(spec["model"].encode(), ll.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {spec['model']}")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    params = ll.llama_context_default_params()
    params.n_ctx = longest_workload + N_BATCH
    params.n_batch = params.n_ubatch = N_BATCH
    params.n_seq_max = max(len(reqs) for reqs in spec["workloads"].values())
    params.n_threads = params.n_threads_batch = spec["threads"]
    params.kv_unified = True  # one pool for all sequences, as the other engines' paged KV
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    batch = ll.llama_batch_init(N_BATCH, 0, 1)

    def add(index: int, token: int, pos: int, seq: int) -> None:
        batch.token[index] = token
        batch.pos[index] = pos
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = seq
        batch.logits[index] = 0

    def generate(requests: Requests) -> list[list[int]]:
        ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
        outputs: list[list[int]] = [[] for _ in requests]
        pending = {i: list(r["prompt"]) for i, r in enumerate(requests)}  # tokens not yet decoded
        positions = [0] * len(requests)
        while pending:
            n, last = 0, {}  # last: sequence -> its batch row whose logits we sample from
            for seq, tokens in pending.items():
                take = min(len(tokens), N_BATCH - n)
                if take == 0:
                    break
                for k in range(take):
                    add(n + k, tokens[k], positions[seq] + k, seq)
                n += take
                positions[seq] += take
                del tokens[:take]
                if not tokens:
                    batch.logits[n - 1] = 1
                    last[seq] = n - 1
            batch.n_tokens = n
            if ll.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for seq, row in last.items():
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), shape=(n_vocab,))
                token = int(logits.argmax())
                outputs[seq].append(token)
                if len(outputs[seq]) < requests[seq]["max_new_tokens"]:
                    pending[seq] = [token]
                else:
                    del pending[seq]
        return outputs

    return generate, {"llama_cpp_python": ll.__version__, "weights": "f32 GGUF"}


if __name__ == "__main__":
    run(load)
