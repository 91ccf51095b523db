"""cpu_rng reproduces PyTorch's CPU exponential noise bit for bit (values and generator state). Floats are compared as
bit patterns (so +0.0 != -0.0). `fast_multinomial`, built on it, is tested in test_multinomial.py."""


import pytest
import torch

from diffusiongemma.generation import cpu_rng

pytestmark = pytest.mark.usefixtures("one_thread")


def bits_of(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def libm_noise(ks: list[int]) -> torch.Tensor:
    """PyTorch's scalar formula, float32(-1.0 * log1p(-k * 2^-53)), with libm's log1p, one element at a time."""
    return torch.tensor([-1.0 * cpu_rng._LOG1P(-(k * 2.0**-53)) for k in ks], dtype=torch.float64).to(torch.float32)


def test_probe_passes_on_this_build():
    assert cpu_rng.exponential_matches_torch()


@pytest.mark.parametrize("n", [1, 2, 623, 625, 1000, 65_537, 300_001])
@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_exponential_matches_torch_with_an_explicit_generator(n, seed):
    g = torch.Generator().manual_seed(seed)
    torch.randint(0, 10, (seed % 5 + 1,), generator=g)  # start mid-way through an mt19937 block
    start = g.get_state()
    expected = torch.empty(n).exponential_(1, generator=g)
    after = g.get_state()
    g.set_state(start)
    got = cpu_rng.exponential_(torch.empty(n), g)
    assert torch.equal(bits_of(got), bits_of(expected))
    assert torch.equal(g.get_state(), after)


def test_exponential_matches_torch_on_the_global_generator_in_chunks_with_reused_scratch():
    torch.manual_seed(3)
    torch.rand(11)
    start = torch.random.get_rng_state()
    expected = torch.empty(5, 40_000).exponential_(1)
    next_draws = torch.randint(0, 1000, (50,))
    torch.random.set_rng_state(start)
    got = torch.empty(5, 40_000)
    bits, work = torch.empty(30_000, dtype=torch.int64), torch.empty(30_000, dtype=torch.float64)
    flat = got.view(-1)
    for a in range(0, flat.numel(), 30_000):  # chunks of the stream, in order, equal the whole call
        cpu_rng.exponential_(flat[a : a + 30_000], bits=bits, work=work)
    assert torch.equal(bits_of(got), bits_of(expected))
    assert torch.equal(torch.randint(0, 1000, (50,)), next_draws)  # later draws continue identically


def test_noise_formula_against_libm_across_magnitudes():
    g = torch.Generator().manual_seed(1)
    # k = 0 (q = +0.0), tiny k, k = 2^52 (x = 1/2 -> ln 2 = 0x3F317218 in fp32), the top of the range, and 20k values
    # log-uniform over [1, 2^53) so every binade of x and of q is covered
    ks = [0, 1, 2, 3, 1000, 2**52, 2**53 - 1, 2**53 - 2, 2**53 - 2**20]
    ks += torch.pow(2.0, torch.rand(20_000, generator=g, dtype=torch.float64) * 53).long().clamp(max=2**53 - 1).tolist()
    k = torch.tensor(ks, dtype=torch.int64)
    got = cpu_rng.noise_from_bits_(torch.empty(len(ks)), k.clone())
    assert torch.equal(bits_of(got), bits_of(libm_noise(ks)))
    assert bits_of(got)[0] == 0  # +0.0, not -0.0: p / q must be +inf there, as in PyTorch
    assert bits_of(got)[5] == 0x3F317218


def test_libm_fix_up_path_is_exact_too():
    # with a margin of 2^24 ulps about one element in 16 goes through libm; the result must not change
    g = torch.Generator().manual_seed(5)
    start = g.get_state()
    expected = torch.empty(100_000).exponential_(1, generator=g)
    g.set_state(start)
    got = cpu_rng.exponential_(torch.empty(100_000), g, margin=1 << 24)
    assert torch.equal(bits_of(got), bits_of(expected))
