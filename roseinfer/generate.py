"""A quick look from the shell:

python -m roseinfer.generate --prompt "Hello, my name is" --max-new-tokens 30
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from roseinfer import SamplingParams
from roseinfer.cli import command_parser, engine_from_args


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m roseinfer.generate", __doc__)
    p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--no-stop-on-eos", action="store_true")
    p.add_argument("--stream", action="store_true", help="print tokens as they come (first prompt only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    engine = engine_from_args(args)
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_on_eos=not args.no_stop_on_eos,
        stop=args.stop,
    )
    start = time.perf_counter()
    if args.stream:
        print(args.prompt[0], end="", flush=True)
        for piece in engine.stream_generate(args.prompt[0], params):
            print(piece, end="", flush=True)
        print()
        return 0
    outputs = engine.generate(args.prompt, params)
    elapsed = time.perf_counter() - start
    for out in outputs:
        print(f"{out.prompt}{out.text}")
        print(f"  [{len(out.token_ids)} tokens, finish_reason={out.finish_reason}]", file=sys.stderr)
    total = sum(len(o.token_ids) for o in outputs)
    print(f"{total} tokens in {elapsed:.2f}s ({total / elapsed:.1f} tok/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
