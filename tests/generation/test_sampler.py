"""Sampler math (generation/sampler.py): pure functions on hand-built logits, blockwise reference exactness, and a
chi-square test that the fast sampler draws from exactly the reference distribution (and that a biased one fails)."""

import math

import pytest
import torch

from diffusiongemma.generation.sampler import (
    FastSampler,
    ReferenceSampler,
    entropy_bound_accept,
    inverse_cdf_sample,
    one_pass,
    renoise,
    row_generators,
    temperature_at,
    token_entropy,
)

# chi-square critical values at significance 1e-4 (df -> value), from the chi-square quantile table
CHI2_CRIT = {3: 21.108, 5: 25.745}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_temperature_at_counts_steps_remaining():
    # T = 0.4 + 0.4 * n / 4: n = 4 -> 0.8 (first step), n = 1 -> 0.5 (last step, never t_min)
    assert temperature_at(4, 4, 0.4, 0.8).item() == pytest.approx(0.8)
    assert temperature_at(1, 4, 0.4, 0.8).item() == pytest.approx(0.5)
    assert temperature_at(1, 4, 0.4, 0.8).dtype == torch.float32


def test_token_entropy_hand_values():
    logits = torch.tensor([[0.0, 0.0], [0.0, -math.inf], [0.0, math.log(3.0)]])
    # [0, 0]: p = (1/2, 1/2) -> ln 2 = 0.693147
    # [0, -inf]: p = (1, 0) -> 0 (the -inf log-prob is clamped, so 0 * finite = 0, not NaN)
    # [0, ln 3]: p = (1/4, 3/4) -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    expected = torch.tensor([0.693147, 0.0, 0.562335])
    torch.testing.assert_close(token_entropy(logits), expected, atol=1e-6, rtol=0)


def test_entropy_bound_accept_is_a_prefix_of_the_ranking():
    entropy = torch.tensor([[0.3, 0.01, 0.05]])
    # ascending: 0.01 (pos 1), 0.05 (pos 2), 0.3 (pos 0); exclusive cumsums 0, 0.01, 0.06
    assert entropy_bound_accept(entropy, 0.1).tolist() == [[True, True, True]]  # 0.06 <= 0.1
    assert entropy_bound_accept(entropy, 0.03).tolist() == [[False, True, True]]  # 0.06 > 0.03
    assert entropy_bound_accept(entropy, 0.005).tolist() == [[False, True, False]]  # lowest always accepted


def test_renoise_never_keeps_the_previous_canvas():
    sample, noise = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 2, 3]])
    accepted = torch.tensor([[True, False, True]])
    assert renoise(sample, accepted, noise).tolist() == [[5, 2, 7]]


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


def whole_tensor_reference_step(logits, bound):
    """The reference step written plainly over the whole tensor (as transformers' built-in does it)."""
    B, L, V = logits.shape
    entropy = token_entropy(logits)
    sample = torch.multinomial(logits.softmax(-1).view(B * L, V), 1).view(B, L)
    noise = torch.randint(0, V, (B, L))
    return renoise(sample, entropy_bound_accept(entropy, bound), noise), logits.argmax(-1), entropy


def test_blockwise_reference_step_is_bit_exact():
    # V = 2**17 -> 8 rows per block: 3 * 5 = 15 positions span two blocks, the second one partial
    logits = torch.randn(3, 5, 2**17, generator=torch.Generator().manual_seed(0)) * 3
    torch.manual_seed(11)
    expected = whole_tensor_reference_step(logits, 0.1)
    state = torch.get_rng_state()
    torch.manual_seed(11)
    out = ReferenceSampler(0.1, 2**17).step(logits)
    assert torch.equal(out.canvas, expected[0]) and torch.equal(out.argmax, expected[1])
    assert torch.equal(out.entropy, expected[2])
    assert torch.equal(torch.get_rng_state(), state)  # same amount of global RNG consumed


def test_fast_sampler_rows_draw_from_their_own_generators():
    logits = torch.randn(2, 4, 50, generator=torch.Generator().manual_seed(0))
    batch = FastSampler(0.1, 50, row_generators(2, torch.device("cpu"), seed=[3, 8]))
    alone = FastSampler(0.1, 50, row_generators(1, torch.device("cpu"), seed=[8]))
    both = batch.step(logits.clone())
    second = alone.step(logits[1:].clone())
    assert torch.equal(both.canvas[1:], second.canvas)
    # a subset of rows uses exactly those rows' generators
    again = FastSampler(0.1, 50, row_generators(2, torch.device("cpu"), seed=[3, 8]))
    only_second = again.step(logits[1:].clone(), rows=torch.tensor([1]))
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


def test_first_argmax_matches_torch_argmax_including_ties():
    from diffusiongemma.generation.sampler import first_argmax

    x = torch.randint(0, 3, (64, 2048)).float()  # many ties, across and inside blocks of 1024
    x[5] = 0.0
    x[6, 1500] = 9.0
    assert torch.equal(first_argmax(x), x.argmax(-1))
    y = torch.randn(4, 100)  # 100 has no power-of-two divisor >= 32: one block
    assert torch.equal(first_argmax(y), y.argmax(-1))


def test_fast_sampler_soft_embedding_over_staged_row_groups():
    """Probabilities are staged over several row blocks per soft-embedding matmul (here blocks of 16 rows, groups of
    64, and a last partial group): the result is softmax(logits) @ embedding for every row."""
    from diffusiongemma.generation.sampler import FastSampler, row_block, soft_group_rows

    B, L, V, H = 2, 75, 65536, 8
    assert row_block(V) == 16 and soft_group_rows(V) >= 64
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(V, H, generator=g)
    logits = torch.randn(B, L, V, generator=g) * 3
    sampler = FastSampler(0.1, V, [torch.Generator().manual_seed(b) for b in range(B)])
    out = sampler.step(logits.clone(), None, lambda p: p @ weight)
    torch.testing.assert_close(out.soft, logits.softmax(-1) @ weight, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.argmax, logits.argmax(-1), atol=0, rtol=0)
