"""SamplingParams validation, top-k/top-p masks, seeded reproducibility."""

from __future__ import annotations

import math

import pytest
import torch

from roseinfer import SamplingParams
from roseinfer.sampling import (
    SAMPLING_CHUNK,
    Sampler,
    apply_top_k_top_p,
    first_index_above,
    inverse_cdf_sample,
)

NEG = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [0.0, 0.0, 9.0, 1.0, 8.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 1]), torch.tensor([1.0, 1.0]))
    assert out.tolist() == [[NEG, 5.0, NEG, 4.0, NEG], [NEG, NEG, 9.0, NEG, NEG]]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()

    def kept(p):
        masked = apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([p]))
        return torch.isfinite(masked)[0].tolist()

    assert kept(0.5) == [True, False, False, False]
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.8) == [True, True, False, False]
    assert kept(0.81) == [True, True, True, False]
    assert kept(1.0) == [True, True, True, True]
    assert kept(0.01) == [True, False, False, False]  # the top token always survives


def test_top_k_and_top_p_together_and_disabled_rows():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0]])
    out = apply_top_k_top_p(logits, torch.tensor([3, 0]), torch.tensor([0.99, 1.0]))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]
    assert torch.equal(out[1], logits[1])


def test_sampler_greedy_rows_take_argmax_and_masks_hold():
    sampler = Sampler()
    logits = torch.randn(4, 100)
    params = [
        SamplingParams(),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.7, top_k=3),
        SamplingParams(),
    ]
    for _ in range(20):
        out = sampler(logits, params, [None] * 4)
        assert out[0] == logits[0].argmax() and out[3] == logits[3].argmax()
        assert out[1] == logits[1].argmax()
        assert out[2] in logits[2].topk(3).indices


def test_seeded_sampling_is_reproducible_and_batch_independent():
    sampler = Sampler()
    logits = torch.randn(3, 1000)

    def draw(seed, rows):
        p = SamplingParams(temperature=1.0, seed=seed)
        gens = [p.make_generator(torch.device("cpu")) for _ in rows]
        return [sampler(logits[rows], [p] * len(rows), gens).tolist() for _ in range(5)]

    assert draw(7, [0]) == draw(7, [0])
    assert draw(7, [0]) != draw(8, [0])
    # Row 0 alone and row 0 inside a batch draw the same tokens with the same seed.
    assert [d[0] for d in draw(7, [0, 1, 2])] == [d[0] for d in draw(7, [0])]


def test_inverse_cdf_sample_matches_a_float64_lookup_on_the_same_draw():
    torch.manual_seed(0)
    rows, vocab = 48, 3 * SAMPLING_CHUNK + 5  # the last chunk is short
    probs = (torch.randn(rows, vocab) * 4).softmax(dim=-1)
    probs[::4, SAMPLING_CHUNK : 2 * SAMPLING_CHUNK] = 0.0  # a whole chunk without mass
    probs[1::4] *= 1e-3  # rows need not be normalized
    probs[2::4, ::2] = 1e-9  # many tiny tokens
    got = inverse_cdf_sample(probs, [torch.Generator().manual_seed(row) for row in range(rows)])
    for row in range(rows):
        u = torch.rand(1, generator=torch.Generator().manual_seed(row), dtype=torch.float64)
        cdf = probs[row].double().cumsum(0)
        assert got[row] == torch.searchsorted(cdf, u * cdf[-1], right=True).item()
        assert probs[row, got[row]] > 0


def testfirst_index_above_never_lands_on_a_token_without_probability():
    cdf = torch.tensor([[0.0, 0.2, 0.2, 0.7, 1.0, 1.0]], dtype=torch.float64)
    picks = [
        first_index_above(cdf, torch.tensor([[t]], dtype=torch.float64)).item()
        for t in (0.0, 0.2, 0.69, 1.0, 1.5)
    ]
    # 0 -> the first token with mass; 0.2 skips the empty token 2; a target at or past the total
    # (rounding) takes the last token with mass, not the empty tail.
    assert picks == [1, 3, 3, 4, 4]


def test_sampling_follows_the_distribution():
    sampler = Sampler()
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().expand(20000, 3).contiguous()
    p = SamplingParams(temperature=1.0, seed=0)
    torch.manual_seed(0)
    counts = torch.bincount(sampler(logits, [p] * 20000, [None] * 20000), minlength=3).float() / 20000
    assert torch.allclose(counts, probs, atol=0.02)


def test_half_precision_logits_sample_safely():
    logits = torch.full((2, 50), -1e4, dtype=torch.bfloat16)
    logits[:, 3] = 10
    out = Sampler()(logits, [SamplingParams(temperature=0.5, top_p=0.9)] * 2, [None, None])
    assert out.tolist() == [3, 3]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_params_are_refused_with_the_field_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_single_stop_string_is_accepted():
    assert SamplingParams(stop="###").stop == ["###"]
