"""Image prompts give the built-in class's logits and same-seed tokens (fp32, CPU, bit-identical).

Images of two sizes (40x60 and 90x30 pixels: 60 and 44 soft tokens, so runs of image tokens far longer than the
sliding window of 8: every image straddles several window boundaries), two images in one prompt, and a left-padded
batch mixing an image prompt with a text-only one.

The built-in `forward` computes the vision overlay and then drops it (spec C.12, H.17); its `generate` applies it by
handing the encoder a prebuilt mask dict. Ours applies the overlay whenever `mm_token_type_ids` are given, so the
overlay parity below compares against the built-in forward given that mask dict, i.e. what the built-in generate runs.
"""

import pytest
import torch
from transformers import DynamicCache

from conftest import pair
from vision_builders import image_prompt, random_image, tiny_processor, tiny_vision_config

IMAGES = [random_image(40, 60, 0), random_image(90, 30, 1)]
PROMPTS = {
    "one-image": (["Look: <x125> what?"], [[IMAGES[1]]]),
    "two-images": (["A <x125> and B <x125>, compare."], [[IMAGES[0], IMAGES[1]]]),
    "padded-mixed-batch": (["hi <x125> there", "a text-only prompt, longer than the other"], [[IMAGES[0]], []]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return pair(tmp_path_factory.mktemp("vision_parity"), tiny_vision_config())


@pytest.fixture(scope="module")
def prompts():
    processor = tiny_processor()
    return {name: image_prompt(texts, images, processor) for name, (texts, images) in PROMPTS.items()}


def builtin_overlay_masks(builtin, inputs: dict, cache) -> dict:
    """The encoder mask dict the built-in `generate` builds for a prefill with `mm_token_type_ids`."""
    ids = inputs["input_ids"]
    return builtin.model.encoder.create_masks_for_generate(
        config=builtin.config, inputs_embeds=torch.empty(*ids.shape, 0), attention_mask=inputs["attention_mask"].bool(),
        past_key_values=cache, position_ids=torch.arange(ids.shape[1])[None],
        mm_token_type_ids=inputs["mm_token_type_ids"],
    )


def forward_kwargs(x: dict) -> dict:
    """The prompt's ids, pixels and patch positions, and a fixed canvas: what both classes' `forward` take."""
    canvas = torch.randint(0, 128, (x["input_ids"].shape[0], 16), generator=torch.Generator().manual_seed(7))
    return dict(input_ids=x["input_ids"], pixel_values=x["pixel_values"], image_position_ids=x["image_position_ids"],
                decoder_input_ids=canvas)


@torch.no_grad()
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_forward_logits_identical_without_overlay(models, prompts, name):
    builtin, ours = models
    x = prompts[name]
    kw = dict(forward_kwargs(x), attention_mask=x["attention_mask"])
    expected, got = builtin(**kw), ours(**kw)
    assert torch.equal(expected.logits, got.logits)
    assert torch.equal(expected.encoder_last_hidden_state, got.encoder_last_hidden_state)


@torch.no_grad()
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_forward_logits_identical_with_vision_overlay(models, prompts, name):
    builtin, ours = models
    x = prompts[name]
    kw = forward_kwargs(x)
    cache = DynamicCache(config=builtin.config.get_text_config())
    expected = builtin(**kw, attention_mask=builtin_overlay_masks(builtin, x, cache), past_key_values=cache).logits
    got = ours(**kw, attention_mask=x["attention_mask"], mm_token_type_ids=x["mm_token_type_ids"]).logits
    assert torch.equal(expected, got)
    # the overlay is not a no-op here: without it the logits move
    plain = ours(**kw, attention_mask=x["attention_mask"]).logits
    assert (plain - got).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_same_seed_generate_identical(models, prompts, name):
    builtin, ours = models
    x = prompts[name]
    torch.manual_seed(5)
    expected = builtin.generate(**x, max_new_tokens=32, max_denoising_steps=4)
    torch.manual_seed(5)
    got = ours.generate(**x, max_new_tokens=32, max_denoising_steps=4)
    assert torch.equal(expected.sequences, got.sequences)
    assert torch.equal(expected.tokens_per_forward, got.tokens_per_forward)


@torch.no_grad()
def test_precomputed_image_features_are_interchangeable(models, prompts):
    """`mm_encoder_outputs={"image": get_image_features(...)}` from either class gives the logits of pixel_values."""
    builtin, ours = models
    x = prompts["two-images"]
    kw = forward_kwargs(x)
    from_pixels = ours(**kw).logits
    base = {k: v for k, v in kw.items() if k not in ("pixel_values", "image_position_ids")}
    for get_image_features in (ours.get_image_features, builtin.model.encoder.get_image_features):
        features = get_image_features(x["pixel_values"], x["image_position_ids"])
        assert torch.equal(ours(**base, mm_encoder_outputs={"image": features}).logits, from_pixels)


@torch.no_grad()
def test_no_overlay_when_the_config_says_causal(tmp_path, prompts):
    """use_bidirectional_attention=None: mm_token_type_ids change nothing, in either class."""
    builtin, ours = pair(tmp_path, tiny_vision_config(bidirectional=None))
    x = prompts["two-images"]
    torch.manual_seed(2)
    expected = builtin.generate(**x, max_new_tokens=16, max_denoising_steps=3)
    torch.manual_seed(2)
    got = ours.generate(**x, max_new_tokens=16, max_denoising_steps=3)
    assert torch.equal(expected.sequences, got.sequences)


@torch.no_grad()
def test_bf16_same_seed_generate_identical(tmp_path, prompts):
    """bf16 weights: the soft tokens are cast to the embedding dtype before the scatter, as in the built-in."""
    builtin, ours = pair(tmp_path, tiny_vision_config(), dtype=torch.bfloat16)
    x = prompts["padded-mixed-batch"]
    torch.manual_seed(5)
    expected = builtin.generate(**x, max_new_tokens=32, max_denoising_steps=4)
    torch.manual_seed(5)
    got = ours.generate(**x, max_new_tokens=32, max_denoising_steps=4)
    assert torch.equal(expected.sequences, got.sequences)
