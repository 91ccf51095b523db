"""The fast sampler (generation/fast_sampler.py): hand values, a chi-square test that it draws from exactly the
reference distribution (and that a biased one fails), per-row generators, and never a zero-weight token."""

import math

import pytest
import torch

from diffusiongemma.generation.sampler import SamplerContext
from diffusiongemma.sampler_configs import EntropyBoundSamplerConfig

from diffusiongemma.generation.entropy_bound import row_block, token_entropy
from diffusiongemma.generation.fast_sampler import (
    FastSampler,
    inverse_cdf_sample,
    one_pass,
    row_generators,
    soft_group_rows,
)

# chi-square critical values at significance 1e-4 (df -> value), from the chi-square quantile table
CHI2_CRIT = {3: 21.108, 5: 25.745}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_inverse_cdf_sample_hand_values():
    # weights [1, 0, 3]: CDF [1, 1, 4]; target = u * 4; the first CDF entry strictly above the target wins
    weights = torch.tensor([[1.0, 0.0, 3.0]]).expand(4, 3)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999])
    # targets 0 -> 0; 0.9996 -> 0; 1.0 -> 2 (token 1 has zero weight and is skipped); 3.9996 -> 2
    assert inverse_cdf_sample(weights, u).tolist() == [0, 0, 2, 2]


def test_one_pass_matches_the_separate_computations():
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(0)) * 4
    out = one_pass(logits, torch.rand(8, dtype=torch.float64))
    assert torch.equal(out.argmax, logits.argmax(-1))
    torch.testing.assert_close(out.entropy, token_entropy(logits), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.probs, logits.softmax(-1), atol=1e-7, rtol=1e-5)


def chi_square(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=len(probs)).double()
    expected = probs.double() * len(samples)
    return float(((counts - expected) ** 2 / expected).sum())


LOGITS = torch.tensor([1.2, -0.3, 0.0, 2.0, -1.5, 0.7])
DRAWS = 60_000


def fast_draws(logits: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return one_pass(logits.expand(n, -1).contiguous(), u).sample


def reference_draws(logits: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.multinomial(logits.softmax(-1).expand(n, -1).contiguous(), 1).view(-1)


def biased_draws(logits: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    """A plausible bug: temperature applied twice-ish (logits sharpened by 5%)."""
    return fast_draws(logits * 1.05, n, seed)


@pytest.mark.parametrize("draw", [fast_draws, reference_draws])
def test_sampler_matches_the_exact_distribution(draw):
    stat = chi_square(draw(LOGITS, DRAWS), LOGITS.softmax(-1))
    assert stat < CHI2_CRIT[5], f"chi-square {stat:.1f} rejects the exact distribution"


def test_chi_square_test_detects_a_biased_sampler():
    stat = chi_square(biased_draws(LOGITS, DRAWS), LOGITS.softmax(-1))
    assert stat > CHI2_CRIT[5], f"a 5% temperature error went unnoticed (chi-square {stat:.1f})"


def test_two_level_cdf_distribution_across_blocks():
    # V = 2048 -> two blocks of 1024; mass on tokens at both block edges, every other token impossible
    logits = torch.full((2048,), -math.inf)
    support = torch.tensor([0, 1023, 1024, 2047])
    logits[support] = torch.tensor([0.5, -0.2, 1.0, 0.0])
    u = torch.rand(20_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    samples = inverse_cdf_sample(logits.exp().expand(20_000, -1), u)
    assert bool(torch.isin(samples, support).all())
    remapped = torch.searchsorted(support, samples)
    assert chi_square(remapped, logits[support].softmax(-1)) < CHI2_CRIT[3]


def fast(bound: float, vocab: int) -> FastSampler:
    return FastSampler(EntropyBoundSamplerConfig(entropy_bound=bound), SamplerContext(vocab, 4))


def fast_step(sampler, logits, generators, soft_embed=None):
    B = logits.shape[0]
    return sampler.step(logits, None, torch.ones(B), [0] * B, generators, soft_embed)


def test_fast_sampler_rows_draw_from_their_own_generators():
    logits = torch.randn(2, 4, 50, generator=torch.Generator().manual_seed(0))
    both = fast_step(fast(0.1, 50), logits.clone(), row_generators(2, torch.device("cpu"), seed=[3, 8]))
    second = fast_step(fast(0.1, 50), logits[1:].clone(), row_generators(1, torch.device("cpu"), seed=[8]))
    assert torch.equal(both.canvas[1:], second.canvas)
    # a subset of rows uses exactly those rows' generators
    gens = row_generators(2, torch.device("cpu"), seed=[3, 8])
    only_second = fast_step(fast(0.1, 50), logits[1:].clone(), gens[1:])
    assert torch.equal(only_second.canvas, second.canvas)


def test_row_generators_arguments():
    cpu = torch.device("cpu")
    a, b = row_generators(2, cpu, seed=5)
    assert torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(torch.rand(3, generator=b), torch.rand(3, generator=torch.Generator().manual_seed(6)))
    with pytest.raises(ValueError, match="list of 2"):
        row_generators(2, cpu, seed=[1])
    with pytest.raises(ValueError, match="not both"):
        row_generators(2, cpu, seed=1, generator=torch.Generator())
    gens = [torch.Generator(), torch.Generator()]
    assert row_generators(2, cpu, generator=gens) == gens


def test_fast_sampler_soft_embedding_over_staged_row_groups():
    """Probabilities are staged over several row blocks per soft-embedding matmul (here blocks of 16 rows, groups of
    64, and a last partial group): the result is softmax(logits) @ embedding for every row."""


    B, L, V, H = 2, 75, 65536, 8
    assert row_block(V) == 16 and soft_group_rows(V) >= 64
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(V, H, generator=g)
    logits = torch.randn(B, L, V, generator=g) * 3
    out = fast_step(fast(0.1, V), logits.clone(), [torch.Generator().manual_seed(b) for b in range(B)],
                    lambda p: p @ weight)
    torch.testing.assert_close(out.soft, logits.softmax(-1) @ weight, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.argmax, logits.argmax(-1), atol=0, rtol=0)


def test_rounding_gap_never_reaches_a_zero_weight_token():
    # weights [1, 6e-8, 0, ...] in one block of 64: the fp32 block sum rounds up to 1 + 2^-23 = 1.00000012 while the
    # fp64 running sum inside the block ends at 1.00000006. u = 0.99999999 targets 1.00000011, past that end: an
    # uncapped search falls off the block onto token 63 (weight 0); capped, it lands on token 1, the last with weight
    weights = torch.zeros(2, 64)
    weights[:, 0], weights[:, 1] = 1.0, 6e-8
    u = torch.tensor([0.99999999, 0.5], dtype=torch.float64)
    assert inverse_cdf_sample(weights, u).tolist() == [1, 0]
    # the same across blocks: V = 2048, all mass in block 0, u as close to 1 as a double gets
    wide = torch.zeros(1, 2048)
    wide[0, 0], wide[0, 1] = 1.0, 6e-8
    assert inverse_cdf_sample(wide, torch.tensor([1 - 2**-53], dtype=torch.float64)).tolist() == [1]
    # and from logits, through the one-pass path the fast sampler runs
    logits = torch.full((2, 64), -math.inf)
    logits[:, 0], logits[:, 1] = 0.0, math.log(6e-8)
    assert one_pass(logits, u).sample.tolist() == [1, 0]


class BanMostOfTheVocabulary:
    """A logits processor (transformers' signature) that leaves only `allowed` tokens: every other score is -inf."""

    def __init__(self, allowed: torch.Tensor, vocab_size: int):
        self.banned = torch.ones(vocab_size, dtype=torch.bool)
        self.banned[allowed] = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(self.banned, -math.inf)


def test_fast_sampler_never_draws_a_banned_token():
    """A processor bans all but 20 of 4096 tokens (none is the last of its block of 1024, where a search that falls
    off a block lands). 8192 positions per step over 3 steps through the sampler, then 8192 rows through its one-pass
    kernel with uniforms in [1 - 1e-7, 1), the top of the CDF where the fp32/fp64 rounding gap bites (an uncapped
    search draws a banned token in a few hundred of them): never a banned token. An infinite entropy bound accepts
    every sample, so the sampler's canvas is the samples themselves."""
    B, L, V = 64, 128, 4096
    g = torch.Generator().manual_seed(0)
    allowed = torch.tensor([0, 1, 5, 100, 777, 1021, 1022, 1024, 1500, 2046, 2048, 2049, 3000, 3070, 3072, 3500,
                            4000, 4090, 4093, 4094])
    ban = BanMostOfTheVocabulary(allowed, V)
    sampler, gens = fast(math.inf, V), row_generators(B, torch.device("cpu"), seed=1)
    for step in range(3):
        logits = ban(None, torch.randn(B, L, V, generator=g) * 4)
        out = fast_step(sampler, logits.clone(), gens)
        assert bool(torch.isin(out.canvas, allowed).all()), f"step {step}: a banned token was drawn"
        assert torch.equal(out.argmax, logits.argmax(-1))
    logits = ban(None, torch.randn(B * L, V, generator=g) * 4)
    u = 1 - 1e-7 * torch.rand(B * L, dtype=torch.float64, generator=g)
    drawn = one_pass(logits, u).sample
    assert bool(torch.isin(drawn, allowed).all()), f"banned tokens drawn: {drawn[~torch.isin(drawn, allowed)]}"
