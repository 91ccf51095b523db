"""`generate` returns exactly the built-in's sequences for the same seed and weights (reference sampling)."""

import pytest
import torch

from conftest import pair, tiny_config


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return pair(tmp_path_factory.mktemp("gen"))


def both(builtin, ours, seed, *args, **kwargs):
    torch.manual_seed(seed)
    expected = builtin.generate(*args, **kwargs)
    torch.manual_seed(seed)
    got = ours.generate(*args, **kwargs)
    return expected, got


def assert_same(expected, got):
    assert torch.equal(expected.sequences, got.sequences)
    assert torch.allclose(expected.tokens_per_forward.float(), got.tokens_per_forward.float())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_batch1_several_seeds(models, seed):
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(seed))
    assert_same(*both(*models, seed, ids, max_new_tokens=16, max_denoising_steps=6))


def test_several_canvases_and_long_prompt(models):
    ids = torch.randint(3, 128, (1, 21), generator=torch.Generator().manual_seed(7))  # longer than window 8
    expected, got = both(*models, 11, ids, max_new_tokens=40, max_denoising_steps=5)
    assert got.sequences.shape == (1, 21 + 48)  # whole canvases: ceil(40 / 16) = 3
    assert_same(expected, got)


def test_left_padded_batch(models):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 128, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :6] = 0
    ids[mask == 0] = 0
    assert_same(*both(*models, 5, ids, attention_mask=mask, max_new_tokens=32, max_denoising_steps=6))


@pytest.mark.parametrize("stability,confidence", [(0, 10.0), (1, 5.0), (2, 10.0), (1, 0.005)])
def test_stopping_thresholds(models, stability, confidence):
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(9))
    expected, got = both(*models, 9, ids, max_new_tokens=32, max_denoising_steps=8,
                         stability_threshold=stability, confidence_threshold=confidence)
    assert_same(expected, got)


def test_eos_early_stop_and_padding(models):
    builtin, ours = models
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(4)
    free = builtin.generate(ids, max_new_tokens=48, max_denoising_steps=4).sequences
    # choose an EOS id that row 0 produces in its first canvas, so generation stops early with padding after it
    eos = int(free[0, 6 + 5])
    expected, got = both(builtin, ours, 4, ids, max_new_tokens=48, max_denoising_steps=4, eos_token_id=eos,
                         pad_token_id=0)
    assert_same(expected, got)
    first = got.sequences[0, 6:]
    pos = int((first == eos).nonzero()[0])
    assert (first[pos + 1 :] == 0).all()


def test_seeded_canvas_and_self_conditioning(models):
    ids = torch.randint(3, 128, (1, 5))
    canvas = torch.randint(0, 128, (1, 16))
    sc = torch.randn(1, 16, 128)
    assert_same(*both(*models, 2, ids, max_new_tokens=16, max_denoising_steps=4, decoder_input_ids=canvas,
                      self_conditioning_logits=sc))


def test_max_length_and_plain_tensor_output(models):
    builtin, ours = models
    ids = torch.randint(3, 128, (1, 5))
    torch.manual_seed(1)
    expected = builtin.generate(ids, max_length=30, max_denoising_steps=3, return_dict_in_generate=False)
    torch.manual_seed(1)
    got = ours.generate(ids, max_length=30, max_denoising_steps=3, return_dict_in_generate=False)
    assert isinstance(got, torch.Tensor)
    assert torch.equal(expected, got)


def test_other_config(tmp_path):
    builtin, ours = pair(tmp_path, tiny_config(num_hidden_layers=3, layer_types=None, sliding_window=4), seed=3)
    ids = torch.randint(3, 128, (2, 9))
    assert_same(*both(builtin, ours, 3, ids, max_new_tokens=32, max_denoising_steps=5))
