"""flex_attention on CUDA (modeling/attention.py, masks.py): compiled, it runs Triton's fused kernel with the
`BlockMask`s from masks.py; its logits must match SDPA's on the same weights (prompt longer than the window, padding,
a second canvas)."""

import pytest
import torch

from conftest import tiny_config, tiny_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def model_on_cuda(attn: str, dtype: torch.dtype):
    config = tiny_config()
    config._attn_implementation = attn
    return tiny_model(config).to("cuda", dtype)  # same seed: same weights for every backend


def logits(model, ids, mask, canvas):
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas,
                      decoder_attention_mask=torch.cat([mask, torch.ones_like(canvas)], dim=1))
        again = model(past_key_values=first.past_key_values, decoder_input_ids=canvas,
                      self_conditioning_logits=first.logits)
    return torch.cat([first.logits, again.logits])


def test_flex_attention_matches_sdpa_logits_and_tokens():
    """fp32, so the two kernels may differ only in summation order (tokens: on a sharpened model, see below)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 20), generator=g).cuda()  # 20 > window 8
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    canvas = torch.randint(0, 128, (2, 16), generator=g).cuda()
    sdpa = model_on_cuda("sdpa", torch.float32)
    flex = model_on_cuda("flex_attention", torch.float32)
    want, got = logits(sdpa, ids, mask, canvas), logits(flex, ids, mask, canvas)
    assert got.dtype == torch.float32 and got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff <= 2e-4, f"flex vs sdpa logits differ by {diff}"
    with torch.no_grad():  # sharp logits: a random model's near-ties would let summation order flip sampled tokens
        for model in (sdpa, flex):
            model.lm_head.weight.mul_(30)
    kw = dict(attention_mask=mask, sampling="fast", seed=0, max_new_tokens=32, max_denoising_steps=4)
    assert torch.equal(flex.generate(ids, **kw).sequences, sdpa.generate(ids, **kw).sequences)

