"""Semantics switches that name an engine difference (spec E): each changes exactly what it claims."""

import pytest
import torch
from conftest import tiny_config, tiny_model

from diffusiongemma.generation.gumbel_sampler import gumbel_max
from diffusiongemma.modeling.masks import build_decoder_masks

W, L, P = 24, 16, 40


LAYERS = ["sliding_attention", "full_attention"]  # the last layer must be full (the config enforces it)


@pytest.fixture(scope="module")
def one_sliding_layer_model():
    """One sliding layer, then one full layer: the sliding layer's output shows which positions the switch touches."""
    return tiny_model(tiny_config(num_hidden_layers=2, layer_types=LAYERS, sliding_window=W))


def denoise_outputs(model, window: str, prompt, canvas):
    """(sliding layer output [B, L, H], logits [B, L, V]) of one denoising pass under a decoder window."""
    stack = model.get_decoder()
    stack.decoder_window = window
    try:
        cache, collect = model.new_cache(), []
        model.encode(prompt, cache)
        logits = model.head(model.denoise(canvas, cache, collect=collect))
        return collect[0], logits
    finally:
        stack.decoder_window = "reference"


def test_symmetric_window_changes_only_the_positions_whose_window_differs(one_sliding_layer_model, one_thread):
    model = one_sliding_layer_model
    g = torch.Generator().manual_seed(0)
    prompt, canvas = torch.randint(0, 128, (2, P), generator=g), torch.randint(0, 128, (2, L), generator=g)
    with torch.no_grad():
        ref, ref_logits = denoise_outputs(model, "reference", prompt, canvas)
        sym, sym_logits = denoise_outputs(model, "symmetric", prompt, canvas)
        short_ref = denoise_outputs(model, "reference", prompt[:, :8], canvas)[1]
        short_sym = denoise_outputs(model, "symmetric", prompt[:, :8], canvas)[1]
    # reference: every canvas query sees the last W-1 = 23 cached slots (17..39) and the whole canvas. Symmetric:
    # |q - k| <= 23, so query j (slot 40 + j) loses the j oldest of them: only j = 0 keeps its window
    # (and the whole canvas, 16 <= 23, stays visible to everyone).
    delta = (ref - sym).abs().amax(dim=-1)  # [B, L] at the sliding layer's output
    assert delta[:, 0].max() < 1e-5
    assert delta[:, 1:].min() > 1e-4
    assert not torch.allclose(ref_logits, sym_logits)  # the full layer after it mixes positions
    # 8 cached slots + 16 canvas: no pair is farther apart than 23, so the switch changes nothing
    assert torch.equal(short_ref, short_sym)


def test_symmetric_window_mask_and_the_short_prefix_case():
    shapes = {s.layer_type: s for s in one_layer_shapes()}
    masks = build_decoder_masks(shapes, P, L, None, 1, torch.device("cpu"), window="symmetric")
    sliding = masks["sliding_attention"]
    assert (sliding.kv_start, sliding.kv_end) == (P - (W - 1), P + L)
    visible = sliding.mask[0, 0]  # [L, W-1+L]
    # query j sees cached slots 17+j..39: W-1-j of them, and the whole canvas
    assert visible[:, : W - 1].sum(dim=-1).tolist() == [W - 1 - j for j in range(L)]
    assert visible[:, W - 1 :].all()
    assert masks["full_attention"].mask is None
    # a prefix shorter than the window: nothing is farther than W-1, no mask at all (same as the reference)
    short = build_decoder_masks(shapes, 4, L, None, 1, torch.device("cpu"), window="symmetric")
    assert short["sliding_attention"].mask is None
    with pytest.raises(ValueError, match="decoder window"):
        build_decoder_masks(shapes, P, L, None, 1, torch.device("cpu"), window="flash")


def one_layer_shapes():
    from diffusiongemma.modeling.config import layer_shape

    text = tiny_config(num_hidden_layers=2, layer_types=LAYERS, sliding_window=W).text_config
    return [layer_shape(text, i) for i in range(2)]


def test_gumbel_max_worked_example_and_distribution():
    assert gumbel_max(torch.tensor([[0.0, -float("inf")]] * 4)).tolist() == [0, 0, 0, 0]
    torch.manual_seed(0)
    logits = torch.tensor([0.0, 1.0, 2.0]).log_softmax(0)  # p = softmax([0, 1, 2]) = (0.090, 0.245, 0.665)
    draws = gumbel_max(logits.expand(20000, 3))
    freq = torch.bincount(draws, minlength=3) / 20000
    torch.testing.assert_close(freq, logits.exp(), atol=0.015, rtol=0)


def test_gumbel_switch_changes_only_the_samples(one_thread):
    """Same seed: the first step's distribution, argmax, entropy and accepted mask are identical (same inputs); only
    the sampled tokens, hence the next step's input canvas, differ."""
    model = tiny_model()
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    traces = {}
    for sampling in ("reference", "gumbel"):
        torch.manual_seed(3)
        traces[sampling] = model.generate(ids, max_new_tokens=16, max_denoising_steps=4, sampling=sampling,
                                          return_trace=True).trace.tensors
    ref, gum = traces["reference"], traces["gumbel"]
    for name in ("input_canvas", "topk_ids", "topk_logprobs", "argmax", "entropy", "accepted"):
        assert torch.equal(ref[name][0], gum[name][0]), name
    assert not torch.equal(ref["input_canvas"][1], gum["input_canvas"][1])
    # where step 0 accepted a position, the step-1 canvas holds a sample: gumbel's differ somewhere from multinomial's
    accepted = ref["accepted"][0]
    assert not torch.equal(ref["input_canvas"][1][accepted], gum["input_canvas"][1][accepted])


def test_compare_names_the_window_switch_that_removes_a_divergence(saved_pair, tmp_path, capsys, one_thread):
    """An 'engine' with the symmetric window fails the default comparison and passes under --decoder-window."""
    from diffusiongemma.cli import main

    path, _, model = saved_pair
    model.get_decoder().decoder_window = "symmetric"
    try:
        torch.manual_seed(0)
        out = model.generate(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]), max_new_tokens=32,
                             max_denoising_steps=3, return_trace=True, trace_top_k=128)
    finally:
        model.get_decoder().decoder_window = "reference"
    assert out.trace.manifest["decoder_window"] == "symmetric"
    out.trace.save(tmp_path / "t")
    capsys.readouterr()
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t")]) == 1
    assert "recorded with decoder_window 'symmetric', the replay uses 'reference'" in capsys.readouterr().err
    assert main(["compare", "--model", str(path), "--trace", str(tmp_path / "t"), "--decoder-window",
                 "symmetric"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_symmetric_window_is_the_same_switch_in_every_batching(one_sliding_layer_model, one_thread):
    """The row pool (mixed batching, the server's) and batch-invariant rows apply the switch exactly as lock-step:
    same tokens under "symmetric", and those differ from the reference window's (the prompt is longer than W)."""
    model = one_sliding_layer_model
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # sharp: a changed window changes tokens, not just logits
    ids = torch.randint(4, 128, (3, P), generator=torch.Generator().manual_seed(5))
    kw = dict(max_new_tokens=2 * L, max_denoising_steps=4, sampling="fast", seed=7, eos_token_id=None)
    runs = {}
    stack = model.get_decoder()
    try:
        for window in ("reference", "symmetric"):
            stack.decoder_window = window
            for batching in ("lockstep", "mixed", "invariant"):
                extra = {"batch_invariant": True} if batching == "invariant" else {"batching": batching}
                runs[window, batching] = model.generate(ids, **kw, **extra).sequences
    finally:
        stack.decoder_window = "reference"
        with torch.no_grad():
            model.lm_head.weight.div_(30)
    for window in ("reference", "symmetric"):
        assert torch.equal(runs[window, "lockstep"], runs[window, "mixed"]), window
        assert torch.equal(runs[window, "lockstep"], runs[window, "invariant"]), window
    assert not torch.equal(runs["reference", "mixed"], runs["symmetric", "mixed"])
