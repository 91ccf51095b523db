"""Forward logits equal transformers' built-in implementation for the same weights (fp32, CPU)."""

import pytest
import torch

from conftest import pair, tiny_config

CONFIGS = {
    "tiny": {},
    "shared-kv-heads": dict(num_global_key_value_heads=None, global_head_dim=16),
    "wide-window-softcap-10": dict(sliding_window=64, final_logit_softcapping=10.0),
    "two-full-layers": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request, tmp_path_factory):
    return pair(tmp_path_factory.mktemp(request.param), tiny_config(**CONFIGS[request.param]))


def close(a, b):
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= 1e-4


@torch.no_grad()
@pytest.mark.parametrize("prompt_len", [5, 20])  # 20 > sliding window 8
def test_logits_match(models, prompt_len):
    builtin, ours = models
    g = torch.Generator().manual_seed(prompt_len)
    ids = torch.randint(3, 128, (2, prompt_len), generator=g)
    canvas = torch.randint(0, 128, (2, 16), generator=g)
    expected = builtin(input_ids=ids, decoder_input_ids=canvas).logits
    got = ours(input_ids=ids, decoder_input_ids=canvas)
    assert got.logits.dtype == torch.float32
    close(expected, got.logits)


@torch.no_grad()
def test_logits_match_with_padding_and_self_conditioning(models):
    builtin, ours = models
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    canvas = torch.randint(0, 128, (2, 16), generator=g)
    sc = torch.randn(2, 16, 128, generator=g)
    sc_mask = torch.tensor([True, False])
    dec_mask = torch.cat([mask, torch.ones(2, 16, dtype=torch.long)], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas, self_conditioning_logits=sc,
                  self_conditioning_mask=sc_mask, decoder_attention_mask=dec_mask)
    close(builtin(**kwargs).logits, ours(**kwargs).logits)


@torch.no_grad()
def test_cache_reuse_matches(models):
    """Encode once, then denoise from the returned cache only (no input_ids), twice."""
    builtin, ours = models
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 128, (1, 10), generator=g)
    canvas = torch.randint(0, 128, (1, 16), generator=g)
    ref_out = builtin(input_ids=ids, decoder_input_ids=canvas)
    out = ours(input_ids=ids, decoder_input_ids=canvas)
    assert out.past_key_values.get_seq_length() == 10
    for _ in range(2):
        expected = builtin(past_key_values=ref_out.past_key_values, decoder_input_ids=canvas).logits
        close(expected, ours(past_key_values=out.past_key_values, decoder_input_ids=canvas).logits)
    # the decoder never commits: the cache still holds only the prompt
    assert out.past_key_values.get_seq_length() == 10


@torch.no_grad()
def test_missing_canvas_is_drawn_from_global_rng(models):
    builtin, ours = models
    ids = torch.randint(3, 128, (1, 6))
    torch.manual_seed(3)
    expected = builtin(input_ids=ids).logits
    torch.manual_seed(3)
    close(expected, ours(input_ids=ids).logits)


@torch.no_grad()
def test_encoder_hidden_state_matches(models):
    builtin, ours = models
    ids = torch.randint(3, 128, (1, 11))
    canvas = torch.randint(0, 128, (1, 16))
    close(
        builtin(input_ids=ids, decoder_input_ids=canvas).encoder_last_hidden_state,
        ours(input_ids=ids, decoder_input_ids=canvas).encoder_last_hidden_state,
    )


@torch.no_grad()
def test_eager_backend_matches(tmp_path):
    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    builtin, _ = pair(tmp_path)
    eager = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert eager.attention_backend == "eager"
    ids = torch.randint(3, 128, (2, 14))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, :5] = 0
    canvas = torch.randint(0, 128, (2, 16))
    dec_mask = torch.cat([mask, torch.ones(2, 16, dtype=torch.long)], dim=1)
    kwargs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas, decoder_attention_mask=dec_mask)
    close(builtin(**kwargs).logits, eager(**kwargs).logits)
