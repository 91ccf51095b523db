"""Image inputs of `forward` (modeling/vision.py, model.py): attention backends, precomputed features, clear errors."""

import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from conftest import tiny_builtin
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from vision_builders import IMAGE, image_prompt, random_image, tiny_processor, tiny_vision_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision_ckpt")
    builtin = tiny_builtin(tiny_vision_config())
    builtin.save_pretrained(path)
    return path, builtin


@pytest.fixture(scope="module")
def model(checkpoint):
    return DiffusionGemmaForBlockDiffusion.from_pretrained(checkpoint[0]).eval()


@pytest.fixture(scope="module")
def prompt():
    return image_prompt(["hi <x125> there", "a text-only prompt, longer"], [[random_image(40, 60, 0)], []],
                        tiny_processor())


def inputs(x: dict, **overrides) -> dict:
    kw = dict(input_ids=x["input_ids"], attention_mask=x["attention_mask"], pixel_values=x["pixel_values"],
              image_position_ids=x["image_position_ids"], mm_token_type_ids=x["mm_token_type_ids"],
              decoder_input_ids=torch.zeros(x["input_ids"].shape[0], 16, dtype=torch.long))
    kw.update(overrides)
    return {k: v for k, v in kw.items() if v is not None}


@pytest.mark.parametrize("impl", ["sdpa", "eager", "flex_attention"])
def test_every_backend_applies_the_overlay_like_the_builtin_generate(checkpoint, prompt, impl):
    path, builtin = checkpoint
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path, attn_implementation=impl).eval()
    x = prompt
    cache = DynamicCache(config=builtin.config.get_text_config())
    masks = builtin.model.encoder.create_masks_for_generate(
        config=builtin.config, inputs_embeds=torch.empty(*x["input_ids"].shape, 0),
        attention_mask=x["attention_mask"].bool(), past_key_values=cache, position_ids=torch.arange(
            x["input_ids"].shape[1])[None], mm_token_type_ids=x["mm_token_type_ids"])
    # padding queries differ between eager and sdpa (pitfall H.12): the decoder masks the padding slots
    decoder_mask = torch.cat([x["attention_mask"], torch.ones(2, 16, dtype=torch.long)], dim=1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex without torch.compile warns that it runs unfused
        expected = builtin(**inputs(x, attention_mask=masks, mm_token_type_ids=None), past_key_values=cache,
                           decoder_attention_mask=decoder_mask).logits
        # the vision tower itself runs unfused flex on CPU for many seconds: this test is about the text stack
        features = builtin.model.encoder.get_image_features(x["pixel_values"], x["image_position_ids"])
        got = ours(**inputs(x, pixel_values=None, image_position_ids=None), mm_encoder_outputs={"image": features},
                   decoder_attention_mask=decoder_mask).logits
    # sdpa is bit-identical (test_vision_parity.py); eager and flex round the softmax differently from sdpa
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_image_features_enter_only_the_encoder_pass(model, prompt):
    """The vision tower runs once per forward; a denoising pass over the returned cache never calls it."""
    calls = []
    hook = model.model.encoder.vision_tower.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            out = model(**inputs(prompt))
            assert len(calls) == 1
            model(past_key_values=out.past_key_values, decoder_input_ids=torch.zeros(2, 16, dtype=torch.long))
    finally:
        hook.remove()
    assert len(calls) == 1


def test_placeholder_count_must_match_the_features(model, prompt):
    ids = prompt["input_ids"].clone()
    ids[0, (ids[0] == IMAGE).nonzero()[0]] = 40  # one placeholder fewer
    with pytest.raises(ValueError, match=r"59 image placeholder tokens .* 60 soft tokens"):
        model(**inputs(prompt, input_ids=ids))


def test_pixel_values_without_placeholders(model, prompt):
    ids = prompt["input_ids"].masked_fill(prompt["input_ids"] == IMAGE, 40)
    with pytest.raises(ValueError, match="no image placeholder token"):
        model(**inputs(prompt, input_ids=ids, mm_token_type_ids=None))


@pytest.mark.parametrize("overrides,message", [
    (dict(image_position_ids=None), "need `image_position_ids`"),
    (dict(mm_token_type_ids=torch.zeros(1, 3, dtype=torch.long)), "must have the shape of `input_ids`"),
    (dict(pixel_values=torch.zeros(630, 48)), r"must be \[images, patches"),
])
def test_malformed_image_inputs(model, prompt, overrides, message):
    with pytest.raises(ValueError, match=message):
        model(**inputs(prompt, **overrides))


def edited(prompt, name, edit):
    return {name: edit(prompt[name].clone())}


@pytest.mark.parametrize("make,message", [
    (lambda p: dict(pixel_values=p["pixel_values"][..., :40]), "must have 3\\*patch_size\\*patch_size = 48"),
    (lambda p: dict(image_position_ids=p["image_position_ids"].float()), "`image_position_ids` must be integers"),
    (lambda p: edited(p, "image_position_ids", lambda x: x.index_fill_(1, torch.tensor([0]), 10**6)),
     "patch positions in \\[0, "),
    (lambda p: edited(p, "image_position_ids", lambda x: x.index_fill_(1, torch.tensor([0]), -5)),
     "patch positions in \\[0, "),
    (lambda p: dict(pixel_values=p["pixel_values"].long()), "`pixel_values` must be floats"),
    (lambda p: dict(mm_token_type_ids=torch.full_like(p["mm_token_type_ids"], 1)), "1 exactly at the image"),
    (lambda p: edited(p, "mm_token_type_ids", lambda x: x.masked_fill_(x == 1, 2)), "0 \\(text\\) and 1"),
])
def test_image_inputs_out_of_range_are_named(model, prompt, make, message):
    with pytest.raises(ValueError, match=message):
        model(**inputs(prompt, **make(prompt)))


@pytest.mark.parametrize("types", [lambda ids: torch.ones_like(ids), lambda ids: torch.full_like(ids, 2)])
def test_token_types_without_images_are_refused(model, prompt, types):
    """All 1 (or 2) without images would make the whole prompt one bidirectional block and change the logits."""
    text = prompt["input_ids"].masked_fill(prompt["input_ids"] == IMAGE, 40)
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        model.generate(text, mm_token_type_ids=types(text), max_new_tokens=16, max_denoising_steps=2)


def test_pixel_values_and_precomputed_features_together(model, prompt):
    features = model.get_image_features(prompt["pixel_values"], prompt["image_position_ids"])
    with pytest.raises(ValueError, match="either `pixel_values` or `mm_encoder_outputs`"):
        model(**inputs(prompt, mm_encoder_outputs={"image": features}))


@pytest.mark.parametrize("name", ["input_features", "pixel_values_videos"])
def test_audio_and_video_inputs_are_refused(model, prompt, name):
    with pytest.raises(ValueError, match=f"text and images only; got audio/video inputs \\['{name}'\\]"):
        model(**inputs(prompt), **{name: torch.zeros(1, 4)})
    with pytest.raises(ValueError, match="text and images only"):
        model.generate(prompt["input_ids"], **{name: torch.zeros(1, 4)})


def test_images_need_input_ids(model, prompt):
    with pytest.raises(ValueError, match="need `input_ids`"):
        model(past_key_values=model.new_cache(), pixel_values=prompt["pixel_values"])


def test_a_text_only_checkpoint_refuses_images(tmp_path, checkpoint, prompt):
    path, _ = checkpoint
    weights = load_file(str(path / "model.safetensors"))
    text_only = {k: v for k, v in weights.items() if ".vision_tower." not in k and ".embed_vision." not in k}
    for name in ("config.json",):
        (tmp_path / name).write_text((path / name).read_text())
    save_file(text_only, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing weights"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, strict=False).eval()
    with pytest.raises(ValueError, match="text-only"):
        model(**inputs(prompt))
    with torch.no_grad():  # text still works
        model(input_ids=prompt["input_ids"], decoder_input_ids=torch.zeros(2, 16, dtype=torch.long))
