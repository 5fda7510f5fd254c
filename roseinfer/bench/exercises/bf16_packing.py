"""Notebook 11's exercise: a weight packed into the panels roseinfer's bf16 kernel reads."""

from __future__ import annotations

from collections.abc import Callable


def _panel_shape_mistake(shape: tuple, n: int, k: int) -> str:
    """Names the mistake behind a packing of the wrong shape, for a weight [n, k]."""
    panels, pairs = -(-n // 32), k // 2
    if shape == (panels, 32, pairs, 2):
        return ("[N/32][32][K/2][2] keeps each column's K values together (the permute is missing). One step of the "
                "kernel's loop reads one pair of k for all 32 columns, 64 values in a row: [N/32][K/2][32][2]")
    if shape == (panels, pairs, 2, 32):
        return ("[..][2][32] puts a pair's two k values 32 apart. vdpbf16ps multiplies the two halves of each 32-bit "
                "lane, so each column's k and k + 1 sit next to each other: [..][32][2]")
    if shape == (-(-k // 32), n // 2, 32, 2):
        return ("transposed: it packed a [K, N] matrix. The weight is [N, K] (out_features, in_features, as "
                "nn.Linear keeps it): the panels run over N, the pairs over K")
    if len(shape) == 4 and shape[1:4:2] == (pairs, 2) and shape[2] != 32 and shape[0] * shape[2] >= n:
        return (f"panels of {shape[2]} columns: a panel is 32 columns, two zmm registers of 16 fp32 accumulators "
                "(the kernel's NB)")
    if n % 32 and shape == (n // 32, pairs, 32, 2):
        return (f"no padding: N = {n} is {n // 32} panels and {n % 32} columns, and those columns are lost; the last "
                "panel is padded with zero columns to 32, so there are ceil(N/32) panels")
    if not n % 32 and shape == (n // 32 + 1, pairs, 32, 2):
        return f"an extra panel: N = {n} is exactly {n // 32} panels; ceil(N/32) of them, not N//32 + 1"
    return "expected [ceil(N/32), K/2, 32, 2]"


def _panel_value_mistake(out, weight, want, named: bool) -> str:
    """Names the mistake behind a packing of the right shape and dtype but other values. With `named`, weight[n, k]
    is 1000 n + k + 1, so a misplaced value says which weight it is."""
    import torch

    from roseinfer.kernels.cpu.bindings import unpack_panels

    n, k = weight.shape
    panels = want.shape[0]
    padded = weight.new_zeros(panels * 32, k)
    padded[:n] = weight
    if torch.equal(out, padded.reshape(want.shape)):
        return ("the weight's values in their old order: a reshape (or view) to [N/32, K/2, 32, 2] moves nothing. "
                "View it as [N/32, 32, K/2, 2] and permute(0, 2, 1, 3), so that one pair of k for 32 columns lies "
                "together")
    if torch.equal(out, padded.view(panels, 32, 2, k // 2).permute(0, 3, 1, 2)):
        return ("pairs not interleaved: packed[p, j, c] holds W[n, j] and W[n, j + K/2]. The kernel multiplies the "
                "pair x[2j], x[2j + 1], so the weight's pair is W[n, 2j], W[n, 2j + 1]")
    if torch.equal(unpack_panels(out, n), weight):
        return ("the padding is not zero: the columns past N must be zeros (new_zeros, not empty: the bytes packed "
                "should not depend on what the memory held before)")
    p, j, c, t = (int(i) for i in (out != want).nonzero()[0])
    row, col = 32 * p + c, 2 * j + t
    where = f"packed[{p}, {j}, {c}, {t}] should hold W[32p + c, 2j + t] = " + (
        f"W[{row}, {col}]" if row < n else f"0 (padding: column {row} is past N)")
    got = float(out[p, j, c, t])
    if named and got == 0:
        return f"{where}; it holds 0"
    if named and got == int(got) and 0 < got <= n * 1000:
        return f"{where}; it holds W[{int(got - 1) // 1000}, {int(got - 1) % 1000}]"
    return f"{where} = {float(want[p, j, c, t]):g}; it holds {got:g}"


def check_pack_panels(pack: Callable) -> str:
    """Notebook 11: `pack(weight)` lays a projection's weight out as roseinfer's bf16 kernel (linear_bf16.c) reads
    it, as bindings.pack_panels does when PackedLinear is built. weight is [N, K] (out_features, in_features; K even);
    the answer is [ceil(N/32), K/2, 32, 2] with packed[p, j, c, t] = W[32p + c, 2j + t]: panels of 32 output columns,
    in each one pair of k for all 32 columns after another, the columns past N zero. The weight's dtype is kept, and
    the tensor is contiguous: the kernel reads its memory in order, not through strides.

    Compared with pack_panels on a 70 x 12 fp32 weight whose values name their place (1000 n + k + 1; a partial last
    panel) and a 96 x 40 bf16 one (whole panels); the mistake is named. Where this CPU runs the kernel, it then
    multiplies by the answer's panels."""
    import torch

    from roseinfer.kernels.cpu.bindings import bf16_linear, load_bf16_linear_kernel, pack_panels

    gen = torch.Generator().manual_seed(0)
    named = (1000 * torch.arange(70)[:, None] + torch.arange(12) + 1).float()
    cases = (("a 70 x 12 weight (two panels and 6 columns)", named, True),
             ("a 96 x 40 bf16 weight (three whole panels)", torch.randn(96, 40, generator=gen).bfloat16(), False))
    for what, weight, is_named in cases:
        want = pack_panels(weight, 32)
        try:
            out = pack(weight.clone())
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your packing"
        except Exception as exc:
            hint = (f" (N = {weight.shape[0]} is not a whole number of 32-column panels: pad the weight with zero rows "
                    "to the next multiple of 32 first)" if "invalid for input of size" in str(exc) else "")
            return f"FAIL: {what}: it raised {type(exc).__name__}: {exc}{hint}"
        n, k = weight.shape
        if not isinstance(out, torch.Tensor):
            return f"FAIL: {what}: expected a tensor [ceil(N/32), K/2, 32, 2], got {type(out).__name__}"
        if tuple(out.shape) != tuple(want.shape):
            return (f"FAIL: {what}: shape {tuple(out.shape)}, expected {tuple(want.shape)}: "
                    + _panel_shape_mistake(tuple(out.shape), n, k))
        if out.dtype != weight.dtype:
            return (f"FAIL: {what}: dtype {out.dtype}, the weight's is {weight.dtype}: keep it (the engine packs "
                    "bf16 weights, and the kernel reads 2-byte values)")
        if not torch.equal(out, want):
            return f"FAIL: {what}: " + _panel_value_mistake(out, weight, want, is_named)
        if not out.is_contiguous():
            return (f"FAIL: {what}: the right values, but not contiguous: permute only changes the strides, and the "
                    "kernel reads the memory in order; end with .contiguous()")
    if load_bf16_linear_kernel() is None:
        return ("PASS: panels of 32 columns, one pair of k for all of them after another, a partial panel padded with "
                "zeros, as pack_panels packs them (this CPU cannot run roseinfer's bf16 kernel on them)")
    x = torch.randn(5, 40, generator=gen).bfloat16()
    if not torch.equal(bf16_linear(x, out, None, False, 96), bf16_linear(x, want, None, False, 96)):
        return "FAIL: roseinfer's kernel, given these panels, computed another y than with pack_panels' own"
    return ("PASS: panels of 32 columns, one pair of k for all of them after another, a partial panel padded with "
            "zeros, as pack_panels packs them; roseinfer's kernel, given them, computed y = x W^T for 5 rows as with "
            "its own")
