"""Tests of `diffusiongemma/training/canvases.py` and `masks.build_canvas_training_masks`: the vectorized multi-canvas
loss equals the per-canvas loop (loss, logits and gradients) on the tiny model, fp32."""

import pytest
import torch

from diffusiongemma.modeling.masks import build_canvas_training_masks
from diffusiongemma.training import block_diffusion_loss
from diffusiongemma.training.canvases import draw_canvas_noise, multi_canvas_loss, per_canvas_loss
from conftest import tiny_config, tiny_model

P, L, K = 5, 16, 3  # three canvases; the tiny window (8) is shorter than a canvas, so sliding layers cut the prefix


def batch(B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 128, (B, P), generator=g)
    labels = torch.randint(4, 128, (B, K * L), generator=g)
    labels[1, 2 * L:] = -100  # row 1 has two canvases (batch padding)
    labels[0, -4:] = 0  # pad after EOS: scored
    mask = torch.ones(B, P, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    return input_ids, labels, mask


@pytest.mark.parametrize("backend, window", [("sdpa", "reference"), ("eager", "reference"), ("sdpa", "symmetric")])
@pytest.mark.parametrize("sc", ["mixed", "none"])
def test_vectorized_loss_equals_the_per_canvas_loop(backend, window, sc, one_thread):
    config = tiny_config()
    config._attn_implementation = backend
    model = tiny_model(config).train()
    model.get_decoder().decoder_window = window  # "symmetric": the |q - k| <= W-1 switch (docs/reference-accuracy.md)
    input_ids, labels, mask = batch()
    clean = labels.masked_fill(labels == -100, 0)
    sc_mask = torch.tensor([[True, False, True], [False, True, False]]) if sc == "mixed" else torch.zeros(2, 3, dtype=torch.bool)
    noise = draw_canvas_noise(clean, L, 128, torch.Generator().manual_seed(1), sc_mask)

    def run(fn):
        model.zero_grad()
        out = fn(model, input_ids, labels, attention_mask=mask, noise=noise)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast, fast_grads = run(multi_canvas_loss)
    slow, slow_grads = run(per_canvas_loss)
    scored = labels != -100
    torch.testing.assert_close(fast.logits[scored], slow.logits[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.diffusion_loss, slow.diffusion_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast.ar_loss, slow.ar_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast.loss, slow.loss, rtol=1e-6, atol=1e-6)
    assert fast_grads.keys() == slow_grads.keys() and len(fast_grads) > 20
    for name in fast_grads:
        # sums over many positions, and the detached first pass rounds differently: measured up to 1.5e-4 of the
        # largest entry (self-conditioning MLP, symmetric window), 3e-5 elsewhere
        scale = slow_grads[name].abs().max().item()
        torch.testing.assert_close(fast_grads[name], slow_grads[name], rtol=1e-4, atol=3e-4 * scale, msg=name)


def test_vectorized_flex_block_mask_gives_the_loop_logits(one_thread):
    # flex_attention has no backward on CPU: forward only here
    config = tiny_config()
    config._attn_implementation = "flex_attention"
    model = tiny_model(config)
    input_ids, labels, mask = batch()
    noise = draw_canvas_noise(labels.masked_fill(labels == -100, 0), L, 128, torch.Generator().manual_seed(1),
                              torch.tensor([[True, False, True], [False, True, False]]))
    with torch.no_grad():
        fast = multi_canvas_loss(model, input_ids, labels, attention_mask=mask, noise=noise)
        slow = per_canvas_loss(model, input_ids, labels, noise, attention_mask=mask)
    scored = labels != -100
    torch.testing.assert_close(fast.logits[scored], slow.logits[scored], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.loss, slow.loss, rtol=1e-6, atol=1e-6)


def test_a_later_canvas_depends_on_the_earlier_clean_canvases_only(one_thread):
    model = tiny_model()
    input_ids, labels, _ = batch()
    clean = labels.masked_fill(labels == -100, 0)
    noise = draw_canvas_noise(clean, L, 128, torch.Generator().manual_seed(1), torch.zeros(2, 3, dtype=torch.bool))
    with torch.no_grad():
        base = multi_canvas_loss(model, input_ids, labels, noise=noise).logits
        changed = labels.clone()
        changed[0, L + 3] = (changed[0, L + 3] + 1) % 128  # a clean token of canvas 1
        after = multi_canvas_loss(model, input_ids, changed, noise=noise).logits
    assert torch.equal(after[0, :2 * L], base[0, :2 * L])  # canvases 0 and 1 do not see clean canvas 1
    assert not torch.allclose(after[0, 2 * L:], base[0, 2 * L:])  # canvas 2 does


def test_mask_predicate_by_hand():
    # P = 2, L = 2, K = 2, cached S = 4 (prompt + both clean canvases), one full layer
    shapes = {"full_attention": tiny_model().model.decoder.type_shapes["full_attention"]}
    m = build_canvas_training_masks(shapes, 2, 2, 2, 4, None, 1, torch.device("cpu"))["full_attention"]
    assert (m.kv_start, m.kv_end) == (0, 8)
    expected = torch.tensor([
        # clean slots 0..3 | noisy 0..3
        [1, 1, 0, 0, 1, 1, 0, 0],  # canvas 0 sees the prompt and itself
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 1, 1],  # canvas 1 also sees clean canvas 0 (slots 2, 3), not clean canvas 1's own slots
        [1, 1, 1, 1, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(m.mask[0, 0], expected)


def test_forward_routes_long_labels_to_the_multi_canvas_loss():
    model = tiny_model().train()
    input_ids, labels, mask = batch()
    torch.manual_seed(5)
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (2, K * L, 128) and out.noise_level.shape == (2, K)
    with pytest.raises(ValueError, match="not a multiple of the canvas length 16"):
        block_diffusion_loss(model, input_ids, labels[:, :20])


def test_gradient_checkpointing_gives_the_same_multi_canvas_loss(one_thread):
    input_ids, labels, mask = batch()
    noise = draw_canvas_noise(labels.masked_fill(labels == -100, 0), L, 128, torch.Generator().manual_seed(2))

    def loss_and_grad(checkpointing):
        model = tiny_model().train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        out = multi_canvas_loss(model, input_ids, labels, attention_mask=mask, noise=noise)
        out.loss.backward()
        return out.loss.detach(), model.get_decoder().layers[0].self_attn.q_proj.weight.grad

    loss, grad = loss_and_grad(False)
    loss_ckpt, grad_ckpt = loss_and_grad(True)
    torch.testing.assert_close(loss_ckpt, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_ckpt, grad, rtol=1e-4, atol=1e-6)


def test_self_conditioning_mask_shape_is_checked():
    model = tiny_model()
    input_ids, labels, _ = batch()
    with pytest.raises(ValueError, match=r"`self_conditioning_mask` must have shape \[2\] or \[2, 3\], got \[3\]"):
        multi_canvas_loss(model, input_ids, labels, self_conditioning_mask=torch.ones(3, dtype=torch.bool))
    out = multi_canvas_loss(model, input_ids, labels, self_conditioning_mask=torch.tensor([True, False]))
    assert out.self_conditioning_mask.tolist() == [[True] * 3, [False] * 3]
