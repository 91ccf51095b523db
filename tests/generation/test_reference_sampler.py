"""The reference sampler (generation/reference_sampler.py): walking the logits in row blocks is bit-exact with the
whole-tensor step the built-in runs, and consumes the same global-RNG draws."""

import pytest
import torch

from diffusiongemma.generation.sampler import SamplerContext
from diffusiongemma.sampler_configs import EntropyBoundSamplerConfig

from diffusiongemma.generation.entropy_bound import entropy_bound_accept, renoise, token_entropy
from diffusiongemma.generation.reference_sampler import ReferenceSampler

pytestmark = pytest.mark.usefixtures("one_thread")


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
    out = ReferenceSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), SamplerContext(2**17, 4)).step(logits)
    assert torch.equal(out.canvas, expected[0]) and torch.equal(out.argmax, expected[1])
    assert torch.equal(out.entropy, expected[2])
    assert torch.equal(torch.get_rng_state(), state)  # same amount of global RNG consumed

