"""Encoder mode is causal by default and bidirectional (with a symmetric window) for
`use_bidirectional_attention="all"` (spec A.2, C.10); the built-in cannot run the latter, so we check behaviour."""

import torch

from conftest import tiny_config, tiny_model


@torch.no_grad()
def encoder_hidden(model, ids):
    return model.encode(ids, model.new_cache())


@torch.no_grad()
def test_causal_encoder_ignores_future_tokens():
    model = tiny_model(tiny_config())
    ids = torch.randint(3, 128, (1, 12))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 128
    a, b = encoder_hidden(model, ids), encoder_hidden(model, changed)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-5, rtol=0)  # equal up to kernel rounding
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3


@torch.no_grad()
def test_bidirectional_encoder_sees_future_tokens():
    config = tiny_config(use_bidirectional_attention="all")
    assert config.text_config.sliding_window == 5  # 8 // 2 + 1 (spec A.2 step 1)
    model = tiny_model(config)
    ids = torch.randint(3, 128, (1, 12))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 128
    a, b = encoder_hidden(model, ids), encoder_hidden(model, changed)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-3  # the full layer lets token 0 see the last token


@torch.no_grad()
def test_bidirectional_sliding_window_is_symmetric():
    from diffusiongemma.modeling.config import layer_shape
    from diffusiongemma.modeling.masks import build_encoder_masks

    config = tiny_config(use_bidirectional_attention="all").text_config
    shape = layer_shape(config, 0)
    masks = build_encoder_masks({"sliding_attention": shape}, 0, 12, None, False, 1, torch.device("cpu"))
    mask = masks["sliding_attention"].mask[0, 0]
    q, k = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    assert torch.equal(mask, (q - k).abs() <= 5)  # |q - k| <= W' with W' = 5
