"""`generate` with image prompts: images encoded once; fast mode (mixed batching, lock-step chunks) row by row."""

import logging

import pytest
import torch

from conftest import tiny_builtin
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from vision_builders import image_prompt, random_image, tiny_processor, tiny_vision_config

IMAGES = [random_image(40, 60, 0), random_image(90, 30, 1)]
ROWS = [("two <x125> images <x125>", [IMAGES[0], IMAGES[1]]), ("text only, a bit longer than it needs", []),
        ("one <x125>", [IMAGES[1]])]
SETTINGS = dict(max_new_tokens=32, max_denoising_steps=3, sampling="fast")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision_gen")
    tiny_builtin(tiny_vision_config()).save_pretrained(path)
    return DiffusionGemmaForBlockDiffusion.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


def tower_calls(model) -> list:
    calls = []
    model._vision_hook = model.model.encoder.vision_tower.register_forward_hook(lambda *a: calls.append(1))
    return calls


@torch.no_grad()
def test_images_are_encoded_once_per_generate(model, processor):
    x = image_prompt([ROWS[0][0]], [ROWS[0][1]], processor)
    calls = tower_calls(model)
    try:
        out = model.generate(**x, max_new_tokens=48, max_denoising_steps=2)  # 3 canvases, 2 commits
    finally:
        model._vision_hook.remove()
    assert len(calls) == 1
    assert out.sequences.shape[1] == x["input_ids"].shape[1] + 48


@torch.no_grad()
@pytest.mark.parametrize("batching,max_batch_size", [("mixed", None), ("mixed", 2), ("lockstep", 1)])
def test_each_row_equals_running_it_alone(model, processor, batching, max_batch_size):
    """Mixed batching (prefill rows with images next to denoising and commit rows) and lock-step chunks give every
    row what it gives alone; the vision tower still runs once."""
    batch = image_prompt([r[0] for r in ROWS], [r[1] for r in ROWS], processor)
    calls = tower_calls(model)
    try:
        got = model.generate(**batch, seed=[3, 4, 5], batching=batching, max_batch_size=max_batch_size, **SETTINGS)
    finally:
        model._vision_hook.remove()
    assert len(calls) == 1
    width = batch["input_ids"].shape[1]
    for b, (text, images) in enumerate(ROWS):
        alone = image_prompt([text], [images], processor)
        expected = model.generate(**alone, seed=[3 + b], batching="lockstep", **SETTINGS).sequences[0]
        P = alone["input_ids"].shape[1]
        assert torch.equal(got.sequences[b, width:width + expected.shape[0] - P], expected[P:])


@torch.no_grad()
def test_mixed_batching_uses_the_vision_overlay(model, processor):
    """Dropping `mm_token_type_ids` (no overlay) changes the tokens: the prefill rows really get the overlay."""
    batch = image_prompt([r[0] for r in ROWS], [r[1] for r in ROWS], processor)
    with_overlay = model.generate(**batch, seed=[3, 4, 5], **SETTINGS).sequences
    plain = {k: v for k, v in batch.items() if k != "mm_token_type_ids"}
    without = model.generate(**plain, seed=[3, 4, 5], **SETTINGS).sequences
    assert not torch.equal(with_overlay[0], without[0])
    assert torch.equal(with_overlay[1], without[1])  # the text-only row has no image


@torch.no_grad()
def test_precomputed_features_in_generate(model, processor):
    x = image_prompt([ROWS[0][0]], [ROWS[0][1]], processor)
    features = model.get_image_features(x["pixel_values"], x["image_position_ids"])
    from_pixels = model.generate(**x, seed=1, **SETTINGS).sequences
    precomputed = {k: v for k, v in x.items() if k not in ("pixel_values", "image_position_ids")}
    assert torch.equal(model.generate(**precomputed, mm_encoder_outputs={"image": features}, seed=1,
                                      **SETTINGS).sequences, from_pixels)


def test_traces_refuse_image_prompts(model, processor):
    x = image_prompt([ROWS[2][0]], [ROWS[2][1]], processor)
    with pytest.raises(ValueError, match="records text prompts only"):
        model.generate(**x, return_trace=True, **SETTINGS)


def test_image_tokens_without_images_warn_in_generate_only(model, processor, caplog):
    """As in the built-in class: `generate` warns once; `forward` (training, calibration) stays quiet."""
    x = image_prompt([ROWS[2][0]], [ROWS[2][1]], processor)
    logging.Logger.warning_once.cache_clear()  # transformers' warning_once remembers messages across tests
    with caplog.at_level(logging.WARNING):
        model(input_ids=x["input_ids"], decoder_input_ids=torch.zeros(1, 16, dtype=torch.long))
        assert "no `pixel_values`" not in caplog.text
        model.generate(x["input_ids"], **SETTINGS)
    assert "holds image tokens (id 125) but no `pixel_values`" in caplog.text


@torch.no_grad()
def test_compiled_mixed_batching_with_image_prompts(model, processor):
    """Compiled mixed passes: the prefill rows with images run eager over their own cache rows (RowCache.rows) next
    to the compiled denoising rows; the tokens are the eager mixed pool's."""
    batch = image_prompt([r[0] for r in ROWS], [r[1] for r in ROWS], processor)
    kw = dict(seed=[3, 4, 5], batching="mixed", max_batch_size=2, **SETTINGS)
    eager = model.generate(**batch, **kw).sequences
    compiled = model.generate(**batch, compile={"backend": "eager"}, **kw).sequences
    assert torch.equal(compiled, eager)
