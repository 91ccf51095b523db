"""Attention backends (modeling/attention.py): sdpa, eager and flex_attention give the built-in class's logits."""

import warnings

import pytest
import torch

from conftest import tiny_builtin, tiny_config
from diffusiongemma import DiffusionGemmaForBlockDiffusion


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Window 4 so that the 12-token prompt is longer than the sliding window."""
    path = tmp_path_factory.mktemp("attn_ckpt")
    builtin = tiny_builtin(tiny_config(sliding_window=4))
    builtin.save_pretrained(path)
    return path, builtin


@pytest.mark.parametrize("impl,backend", [("sdpa", "sdpa"), ("eager", "eager"), ("flex_attention", "flex")])
def test_backend_matches_builtin_logits(checkpoint, impl, backend):
    path, builtin = checkpoint
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path, attn_implementation=impl).eval()
    assert ours.attention_backend == backend
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding on row 0
    canvas = torch.randint(0, 128, (2, 16), generator=g)
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas,
              decoder_attention_mask=torch.cat([mask, torch.ones(2, 16, dtype=mask.dtype)], dim=1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex without torch.compile warns that it runs unfused
        expected = builtin(**kw).logits
        got = ours(**kw).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_flex_generate_follows_sdpa(checkpoint):
    path, _ = checkpoint
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    out = {}
    for impl in ("sdpa", "flex_attention"):
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, attn_implementation=impl).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[impl] = model.generate(ids, sampling="fast", seed=0, max_new_tokens=32, max_denoising_steps=3).sequences
    assert torch.equal(out["sdpa"], out["flex_attention"])
