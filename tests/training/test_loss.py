"""Tests of `diffusiongemma/training/loss.py` on the tiny model (fp32, CPU)."""

import pytest
import torch

from diffusiongemma.training import block_diffusion_loss, corrupt_canvas, freeze_router, sample_noise_level
from conftest import tiny_config, tiny_model

P, L = 12, 16  # prefix longer than the tiny sliding window (8), so sliding layers read a partial cache


def batch(seed: int = 0, B: int = 3):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 128, (B, P), generator=g)
    labels = torch.randint(4, 128, (B, L), generator=g)
    labels[0, -3:] = -100  # ignored positions
    return input_ids, labels


def test_corrupt_canvas_extremes():
    canvas = torch.arange(20).view(2, 10)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(corrupt_canvas(canvas, torch.zeros(2), 128, g), canvas)  # t = 0: nothing replaced
    noisy = corrupt_canvas(canvas, torch.ones(2), 10**6, g)  # t = 1: all replaced (a collision is ~1e-5 likely)
    assert (noisy != canvas).all()
    t = sample_noise_level(10_000, torch.Generator().manual_seed(0))
    assert 1e-3 <= t.min() and t.max() <= 1 and abs(t.mean().item() - 0.5005) < 0.01


def test_loss_equals_hand_computed_value():
    model = tiny_model()
    input_ids, labels = batch()
    B = labels.shape[0]
    out = block_diffusion_loss(model, input_ids, labels, generator=torch.Generator().manual_seed(7))

    # Redo the draws in the documented order: t, replace mask + random tokens, self-conditioning rows.
    g = torch.Generator().manual_seed(7)
    t = sample_noise_level(B, g)
    noisy = corrupt_canvas(labels.masked_fill(labels == -100, 0), t, 128, g)
    sc = torch.rand(B, generator=g) < 0.5
    assert torch.equal(noisy, out.noisy_canvas) and torch.equal(sc, out.self_conditioning_mask)
    assert sc.any() and not sc.all()  # seed 7 exercises both kinds of rows

    # Same model through the public forward: an encoder pass, then decoder passes on the noisy canvas.
    with torch.no_grad():
        first = model(input_ids=input_ids, decoder_input_ids=noisy).logits
        second = model(input_ids=input_ids, decoder_input_ids=noisy, self_conditioning_logits=first,
                       self_conditioning_mask=sc)
        logp = second.logits.log_softmax(-1)
        scored = labels != -100
        nll = -logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # [B, L]
        diffusion = nll[scored].mean()  # uniform weight over the 45 scored positions
        prefix_logp = model.head(second.encoder_last_hidden_state).log_softmax(-1)  # [B, P, V]
        ar = -prefix_logp[:, :-1].gather(-1, input_ids[:, 1:, None]).mean()
    torch.testing.assert_close(out.diffusion_loss, diffusion, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.ar_loss, ar, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss.detach(), diffusion + ar, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits.detach(), second.logits, rtol=1e-5, atol=1e-5)


def test_forward_with_labels_delegates_to_the_loss():
    model = tiny_model()
    input_ids, labels = batch()
    mask = torch.ones_like(input_ids)
    mask[1, :3] = 0
    sc = torch.tensor([True, False, True])
    torch.manual_seed(11)  # no generator: both draw t, the replacement mask and random tokens from the global RNG
    out = model(input_ids=input_ids, attention_mask=mask, labels=labels, self_conditioning_mask=sc)
    torch.manual_seed(11)
    direct = block_diffusion_loss(model, input_ids, labels, attention_mask=mask, self_conditioning_mask=sc)
    assert out.loss.requires_grad and torch.equal(out.loss, direct.loss)
    assert torch.equal(out.logits, direct.logits) and torch.equal(out.noisy_canvas, direct.noisy_canvas)
    assert torch.equal(out.self_conditioning_mask, sc)


def test_ar_loss_ignores_padding():
    model = tiny_model()
    input_ids, labels = batch()
    mask = torch.ones_like(input_ids)
    mask[0, :4] = 0  # left padding of row 0
    g = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    padded = block_diffusion_loss(model, input_ids, labels, attention_mask=mask, generator=g())
    garbage = input_ids.clone()
    garbage[0, :4] = 5  # what sits under the padding must not matter
    again = block_diffusion_loss(model, garbage, labels, attention_mask=mask, generator=g())
    torch.testing.assert_close(padded.loss, again.loss)


def test_self_conditioning_weights_get_gradients_only_when_used():
    input_ids, labels = batch()
    model = tiny_model()
    sc = dict(model.model.decoder.self_conditioning.named_parameters())
    loss = block_diffusion_loss(model, input_ids, labels, self_conditioning_mask=torch.ones(3, dtype=torch.bool))
    loss.loss.backward()
    for name in ("gate_proj.weight", "up_proj.weight", "down_proj.weight", "pre_norm.weight"):
        assert sc[name].grad is not None and sc[name].grad.abs().sum() > 0, name
    model.zero_grad(set_to_none=True)
    off = block_diffusion_loss(model, input_ids, labels, self_conditioning_mask=torch.zeros(3, dtype=torch.bool))
    off.loss.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in sc.values())  # MLP(0) = 0, no signal


def test_diffusion_loss_reaches_the_prefix_through_the_cache():
    model = tiny_model()
    input_ids, labels = batch()
    embed = model.get_input_embeddings().weight
    prefix_only = sorted(set(input_ids.flatten().tolist()) - set(labels.flatten().tolist()))[:1]
    assert prefix_only
    g = torch.Generator().manual_seed(0)
    out = block_diffusion_loss(model, input_ids, labels, generator=g, ar_weight=0.0)
    # with ar_weight 0 the prefix can only matter through the decoder attending to the cached keys/values
    grad = torch.autograd.grad(out.loss, embed)[0]
    assert grad[prefix_only[0]].abs().sum() > 0


def test_loss_decreases_on_a_tiny_overfit_batch():
    model = tiny_model().train()
    input_ids, labels = batch()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        out = block_diffusion_loss(model, input_ids, labels, generator=torch.Generator().manual_seed(3))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(reentrant):
    input_ids, labels = batch()

    def loss_and_grads(checkpointing: bool):
        model = tiny_model().train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            assert model.model.decoder.gradient_checkpointing
        out = block_diffusion_loss(model, input_ids, labels, generator=torch.Generator().manual_seed(7))
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads(False)
    loss_ckpt, grads_ckpt = loss_and_grads(True)
    torch.testing.assert_close(loss_ckpt, loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == grads_ckpt.keys() and len(grads) > 20
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_checkpointing_leaves_the_cache_like_an_ordinary_encoder_pass():
    model = tiny_model().train()
    input_ids, _ = batch()
    plain = model.new_cache()
    model.encode(input_ids, plain)
    model.gradient_checkpointing_enable()
    ckpt = model.new_cache()
    model.encode(input_ids, ckpt)
    assert ckpt.length == plain.length == P
    for a, b in zip(plain.keys + plain.values, ckpt.keys + ckpt.values):
        torch.testing.assert_close(b[:, :, :P], a[:, :, :P])


def test_freeze_router():
    model = tiny_model()
    names = freeze_router(model)
    assert len(names) == 3 * tiny_config().text_config.num_hidden_layers
    out = block_diffusion_loss(model, *batch(), generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if ".router." in n)


@pytest.mark.filterwarnings("error::FutureWarning")  # `gradient_checkpointing=True` is deprecated in TrainingArguments
def test_trainer_runs_with_checkpointing(tmp_path):
    from transformers import Trainer, TrainingArguments

    model = tiny_model().train()
    input_ids, labels = batch(B=4)
    rows = [{"input_ids": i, "labels": lab} for i, lab in zip(input_ids, labels)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3, report_to=[],
        use_cpu=True, activation_checkpointing=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    before = model.get_decoder().layers[0].self_attn.q_proj.weight.detach().clone()
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    result = trainer.train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert model.get_decoder().gradient_checkpointing
    assert not torch.equal(model.get_decoder().layers[0].self_attn.q_proj.weight, before)  # the optimizer stepped
