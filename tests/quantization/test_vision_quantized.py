"""Image prompts on quantized and offloaded checkpoints: the vision tower and its projector stay in full precision
(they are in the FP8/NVFP4 ignore list) and read images exactly as in the dense model."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.modeling.vision_linear import AdaptableClippableLinear
from diffusiongemma.quantization.quantize import quantize_checkpoint
from vision_builders import image_prompt, random_image, tiny_processor, tiny_vision_config

SETTINGS = dict(max_new_tokens=32, max_denoising_steps=3)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision_dense")
    model = tiny_model(tiny_vision_config(), seed=4)
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def prompt():
    return image_prompt(["see <x125> and <x125>"], [[random_image(40, 60, 0), random_image(90, 30, 1)]],
                        tiny_processor())


@torch.no_grad()
def test_fp8_checkpoint_keeps_the_vision_tower_dense_and_reads_images(dense, prompt, tmp_path):
    path, model = dense
    quantize_checkpoint(str(path), str(tmp_path / "fp8"), "fp8-dynamic")
    weights = load_file(tmp_path / "fp8" / "model.safetensors")
    vision = {k: v for k, v in weights.items() if ".vision_tower." in k or ".embed_vision." in k}
    assert vision and all(v.dtype == torch.float32 for v in vision.values())
    assert not any(k.endswith("weight_scale") for k in vision)
    assert any(v.dtype == torch.float8_e4m3fn for v in weights.values())  # the text stack is FP8
    fp8 = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "fp8").eval()
    tower = fp8.model.encoder.vision_tower
    # every linear dense (the clippable wrappers count as linears for PEFT; their `.linear` child is checked here)
    assert all(type(m) is torch.nn.Linear for m in tower.modules()
               if isinstance(m, torch.nn.Linear) and not isinstance(m, AdaptableClippableLinear))
    expected = model.get_image_features(prompt["pixel_values"], prompt["image_position_ids"]).pooler_output
    got = fp8.get_image_features(prompt["pixel_values"], prompt["image_position_ids"]).pooler_output
    assert torch.equal(expected, got)
    torch.manual_seed(0)
    with_images = fp8.generate(**prompt, **SETTINGS).sequences
    torch.manual_seed(0)
    text_only = fp8.generate(prompt["input_ids"], **SETTINGS).sequences  # placeholders read as plain tokens
    assert not torch.equal(with_images, text_only)


@torch.no_grad()
def test_offloaded_model_reads_images_like_the_in_memory_model(dense, prompt, tmp_path):
    path, model = dense
    offloaded = DiffusionGemmaForBlockDiffusion.from_pretrained(
        path, device_map="auto", max_memory={"cpu": "400KB"}, offload_folder=tmp_path / "offload").eval()
    assert any(k.startswith("model.encoder") and v == "disk" for k, v in offloaded.hf_device_map.items())
    outs = []
    for m in (model, offloaded):
        torch.manual_seed(5)
        outs.append(m.generate(**prompt, **SETTINGS).sequences)
    assert torch.equal(*outs)
