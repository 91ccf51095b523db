"""Where users meet image prompts: the Auto classes, `pipeline("image-text-to-text")`, the processor
(diffusiongemma/processing.py) and `diffusiongemma generate --image`."""

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, Gemma4Processor, pipeline

from conftest import tiny_builtin
from diffusiongemma import DiffusionGemmaForBlockDiffusion, load_processor
from diffusiongemma.cli import main
from diffusiongemma.processing import image_prompt_inputs, load_image
from vision_builders import random_image, tiny_processor, tiny_vision_config

SETTINGS = dict(max_new_tokens=16, max_denoising_steps=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A checkpoint folder with the processor files, and two image files."""
    path = tmp_path_factory.mktemp("vision_doors")
    tiny_builtin(tiny_vision_config()).save_pretrained(path)
    tiny_processor().save_pretrained(path)
    random_image(40, 60, 0).save(path / "a.png")
    random_image(90, 30, 1).save(path / "b.jpg")
    return path


@pytest.fixture(scope="module")
def model(folder):
    return DiffusionGemmaForBlockDiffusion.from_pretrained(folder).eval()


def test_auto_classes_give_ours_and_the_gemma4_processor(folder):
    assert type(AutoModelForImageTextToText.from_pretrained(folder)) is DiffusionGemmaForBlockDiffusion
    for processor in (AutoProcessor.from_pretrained(folder), load_processor(folder)):
        assert isinstance(processor, Gemma4Processor)
        assert processor.image_token == "<x125>" and processor.image_processor.patch_size == 4


@torch.no_grad()
def test_image_text_to_text_pipeline_with_chat_image_parts(folder, model):
    pipe = pipeline("image-text-to-text", model=str(folder))
    assert type(pipe.model) is DiffusionGemmaForBlockDiffusion
    messages = [{"role": "user", "content": [{"type": "image", "url": str(folder / "a.png")},
                                             {"type": "text", "text": "What is it?"}]}]
    torch.manual_seed(0)
    out = pipe(text=messages, generate_kwargs=SETTINGS)[0]["generated_text"]
    assert out[-1]["role"] == "assistant"
    # the same tokens as generate on the processor's output: the image reached the model
    processor = load_processor(folder)
    inputs = image_prompt_inputs(processor, "What is it?", [load_image(str(folder / "a.png"))], chat=True)
    assert (inputs["input_ids"] == 125).sum() == 60
    torch.manual_seed(0)
    ids = model.generate(**inputs, **SETTINGS).sequences[0, inputs["input_ids"].shape[1]:]
    assert out[-1]["content"] == processor.decode(ids, skip_special_tokens=True)
    torch.manual_seed(0)
    text_only = model.generate(**processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "What is it?"}]}], add_generation_prompt=True,
        tokenize=True, return_dict=True, return_tensors="pt"), **SETTINGS).sequences[0, -16:]
    assert not torch.equal(text_only, ids)


def test_text_generation_pipeline_still_works_on_a_vision_checkpoint(folder):
    pipe = pipeline("text-generation", model=str(folder))
    assert type(pipe.model) is DiffusionGemmaForBlockDiffusion
    assert pipe("hello", **SETTINGS)[0]["generated_text"].startswith("hello")


def test_processor_refuses_audio_and_video(folder):
    processor = load_processor(folder)
    with pytest.raises(ValueError, match="text and images only; got videos"):
        processor(text=["a"], videos=[[random_image(40, 40, 0)]])
    with pytest.raises(ValueError, match="got audio"):
        processor(text=["a"], audio=[torch.zeros(100).numpy()])


def test_prompt_image_tokens_must_match_the_images(folder):
    processor = load_processor(folder)
    image = load_image(str(folder / "a.png"))
    first = image_prompt_inputs(processor, "about this", [image])
    placed = image_prompt_inputs(processor, "<x125>about this", [image])
    assert torch.equal(first["input_ids"], placed["input_ids"])
    with pytest.raises(ValueError, match="2 image tokens .* for 1 images"):
        image_prompt_inputs(processor, "<x125> and <x125>", [image])


@torch.no_grad()
def test_cli_generate_with_two_images(folder, model, capsys):
    files = [str(folder / "a.png"), str(folder / "b.jpg")]
    assert main(["generate", "--model", str(folder), "--image", files[0], "--image", files[1], "--max-new-tokens",
                 "16", "--steps", "2", "--quiet", "--no-color", "Compare"]) == 0
    printed = capsys.readouterr().out
    processor = load_processor(folder)
    inputs = image_prompt_inputs(processor, "Compare", [load_image(f) for f in files])
    inputs.pop("attention_mask")
    torch.manual_seed(0)
    ids = model.generate(**inputs, **SETTINGS).sequences[0, -16:]
    assert processor.decode(ids, skip_special_tokens=True) in printed


@pytest.mark.parametrize("name,message", [
    ("bad.png", "could not be read as an image"),
    ("missing.png", "does not exist"),
    ("https://example.org/cat.png", "is a URL: pass --allow-network"),
])
def test_cli_image_errors(folder, capsys, name, message):
    source = name if name.startswith("https") else str(folder / name)
    if name == "bad.png":
        (folder / name).write_text("not an image")
    assert main(["generate", "--model", str(folder), "--image", source, "hi"]) == 1
    assert message in capsys.readouterr().err


def test_cli_image_folder_huge_image_and_dead_url(folder, capsys, monkeypatch, tmp_path):
    from PIL import Image

    assert main(["generate", "--model", str(folder), "--image", str(tmp_path), "hi"]) == 1
    assert f"image {tmp_path} is a folder" in capsys.readouterr().err
    big = tmp_path / "big.png"
    Image.new("RGB", (100, 100)).save(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 pixels: over twice the limit, as 14000x14000 is
    assert main(["generate", "--model", str(folder), "--image", str(big), "hi"]) == 1
    err = capsys.readouterr().err
    assert f"image file {big} is too large to decode safely" in err and "Traceback" not in err
    dead = "http://127.0.0.1:9/cat.png"  # the discard port: nothing listens
    assert main(["generate", "--model", str(folder), "--image", dead, "--allow-network", "hi"]) == 1
    err = capsys.readouterr().err
    assert f"image {dead} could not be downloaded or read" in err and "Traceback" not in err
