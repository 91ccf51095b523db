"""The reference sampler on CUDA (generation/sampler.py): its softmax overwrites the logits in place (`out=` aliasing
the input), which must give the same bits as an out-of-place softmax at the real vocabulary size, where CUDA's
softmax makes several passes over each row."""

import pytest
import torch

from diffusiongemma.generation.sampler import SamplerContext
from diffusiongemma.sampler_configs import EntropyBoundSamplerConfig

from diffusiongemma.generation.sampler import ReferenceSampler, token_entropy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("vocab", [1000, 262144])  # one-pass and multi-pass softmax kernels
@torch.no_grad()
def test_in_place_softmax_gives_the_out_of_place_bits(vocab):
    B, L, H = 2, 16, 8
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = 4 * torch.randn(B, L, vocab, device="cuda", generator=g)
    original = logits.clone()
    embed = torch.randn(vocab, H, device="cuda", generator=g)
    seen = {}

    def soft_embed(probs):  # [..., V] -> [..., H]; keeps a copy of what the sampler handed over
        seen["probs"] = probs.clone()
        seen["same_buffer"] = probs.data_ptr() == logits.data_ptr()
        return probs @ embed

    torch.manual_seed(0)
    out = ReferenceSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), SamplerContext(vocab, 4)).step(logits, soft_embed=soft_embed)
    want = torch.softmax(original, dim=-1)
    assert seen["same_buffer"]  # really in place: no second [B, L, V] buffer
    assert torch.equal(seen["probs"].view(B, L, vocab), want)
    assert torch.equal(out.argmax, original.argmax(dim=-1))
    torch.testing.assert_close(out.entropy, token_entropy(original.view(B * L, vocab)).view(B, L))
    torch.manual_seed(0)
    again = ReferenceSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), SamplerContext(vocab, 4)).step(original.clone(), soft_embed=soft_embed)
    assert torch.equal(again.canvas, out.canvas)  # the same draws: deterministic on the GPU
