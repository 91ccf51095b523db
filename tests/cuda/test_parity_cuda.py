"""bf16 parity with transformers' built-in class on CUDA (the real checkpoints' dtype): same weights and seed give
the same logits and the same tokens (reference sampling), also for a left-padded batch and several canvases."""

import pytest
import torch

from conftest import pair, tiny_config

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CONFIGS = {
    "tiny": {},
    "odd-sizes": dict(hidden_size=48, moe_intermediate_size=24, num_experts=5, top_k_experts=2, num_hidden_layers=7,
                      layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 2
                      + ["full_attention"]),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request, tmp_path_factory):
    # loaded in bf16 (not cast afterwards: `.to(bfloat16)` would also cast the built-in's RoPE inverse frequencies)
    builtin, ours = pair(tmp_path_factory.mktemp(request.param), tiny_config(**CONFIGS[request.param]),
                         dtype=torch.bfloat16)
    return builtin.to("cuda"), ours.to("cuda")


def inputs(batch: int, length: int, seed: int, pad: list[int] | None = None):
    ids = torch.randint(3, 128, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, n in enumerate(pad or []):
        mask[row, :n] = 0
        ids[row, :n] = 0
    return ids.cuda(), mask.cuda()


@torch.no_grad()
def test_bf16_logits_match_builtin(models):
    builtin, ours = models
    ids, mask = inputs(2, 20, 0, pad=[0, 5])
    canvas = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1)).cuda()
    dec_mask = torch.cat([mask, torch.ones_like(canvas)], dim=1)
    kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas, decoder_attention_mask=dec_mask)
    want, got = builtin(**kw).logits, ours(**kw).logits
    assert got.dtype == torch.float32
    diff = (got - want).abs().max().item()
    assert diff == 0, f"bf16 logits differ from the built-in by {diff}"


@pytest.mark.parametrize("seed,batch,pad", [(0, 1, None), (1, 1, None), (2, 3, [0, 3, 6])])
def test_bf16_generate_matches_builtin_tokens(models, seed, batch, pad):
    builtin, ours = models
    ids, mask = inputs(batch, 10, seed, pad)
    kw = dict(attention_mask=mask, max_new_tokens=40, max_denoising_steps=6)
    torch.manual_seed(seed)
    want = builtin.generate(ids, **kw)
    torch.manual_seed(seed)
    got = ours.generate(ids, **kw)
    assert got.sequences.shape == want.sequences.shape
    assert torch.equal(got.sequences, want.sequences), (got.sequences != want.sequences).sum().item()
