"""Compile every kernel for a GPU architecture, without a GPU.

    python -m roseinfer.kernels.triton.compile_check [--arch 90] [--dtype fp32 bf16 fp16]

The Triton interpreter (how CI runs the kernels on CPU) is lenient about
types that the real compiler rejects; compiling to a cubin for sm_90
(H100/H200) catches those. Run it without TRITON_INTERPRET set.
"""

from __future__ import annotations

import argparse
import sys

from roseinfer.kernels.triton import paged_attention as k

POINTER_ARGS_INT32 = ("block_tables_ptr", "context_lens_ptr", "query_start_loc_ptr")


def signature(kernel, pointer_dtype: str, constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in POINTER_ARGS_INT32:
            sig[name] = "*i32"
        elif name == "slot_ptr":
            sig[name] = "*i64"
        elif name.endswith("_ptr"):
            sig[name] = f"*{pointer_dtype}"
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def kernels_for(dtype: str) -> list[tuple[object, dict]]:
    return [
        (k._write_kv_kernel, {"ROW": 768, "BLOCK": 1024}),
        (k._paged_decode_kernel, {"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_SIZE": 16, "GROUP": 1, "BLOCK_G": 1}),
        # grouped-query attention: 3 query heads a KV head (SmolLM2's 9 over 3), padded to 4
        (k._paged_decode_kernel, {"HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_SIZE": 16, "GROUP": 3, "BLOCK_G": 4}),
        (
            k._paged_prefill_kernel,
            {
                "HEAD_DIM": 64,
                "BLOCK_D": 64,
                "BLOCK_SIZE": 16,
                "BLOCK_M": 16,
                "BLOCK_N": 32,
                "IEEE": dtype == "fp32",
                "GROUP": 3,
            },
        ),
    ]


def compile_all(arch: int, dtypes: list[str]) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    done = []
    for dtype in dtypes:
        for kernel, constexprs in kernels_for(dtype):
            src = ASTSource(fn=kernel, signature=signature(kernel, dtype, constexprs), constexprs=constexprs)
            compiled = triton.compile(src, target=target)
            assert compiled.asm["cubin"]
            done.append(f"{kernel.__name__}[{dtype}] -> sm_{arch} cubin")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16", "fp16"])
    args = p.parse_args(argv)
    for line in compile_all(args.arch, args.dtype):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
