"""The guard for quantized checkpoints as their real writer makes them: compressed-tensors run on transformers'
built-in class, with a vision tower (llmc_checkpoint.py), loaded through every door.

The written `ignore` lists the vision tower's `...q_proj.linear` modules by name (spec F.4). Since our vision linears
became `AdaptableClippableLinear` (Linears to `isinstance`, for PEFT), those names matched nothing and the loader
quantized the wrappers: FP8 failed with missing tensors, NVFP4 with "needs in_features multiple of 16".
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, pipeline

from conftest import tiny_builtin, tiny_tokenizer
from llmc_checkpoint import write_llm_compressor_checkpoint
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.quantization.fp8 import FP8Linear
from diffusiongemma.quantization.nvfp4 import NVFP4Linear
from diffusiongemma.quantization.quantize import quantize_checkpoint
from diffusiongemma.quantization.schemes import QuantizedCheckpointError
from vision_builders import image_prompt, random_image, tiny_processor, tiny_vision_config

LINEAR = {"FP8_DYNAMIC": FP8Linear, "NVFP4": NVFP4Linear}
VISION_Q = "model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj"
CANVAS = torch.randint(3, 100, (1, 16), generator=torch.Generator().manual_seed(1))
IDS = torch.tensor([[5, 40, 41, 42, 43, 9]])


def write(path, preset, **kwargs):
    builtin = tiny_builtin(tiny_vision_config(), seed=3)
    out = write_llm_compressor_checkpoint(builtin, path, preset, fake_quant_inputs=dict(input_ids=IDS,
                                          decoder_input_ids=CANVAS), **kwargs)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["DiffusionGemmaForBlockDiffusion"]
    (path / "config.json").write_text(json.dumps(config))
    tiny_tokenizer().save_pretrained(path)
    return out


@pytest.fixture(scope="module", params=list(LINEAR))
def written(request, tmp_path_factory):
    """Each twin calibrated on its own inputs (as LLM Compressor does); the FP8 scales are all weight scales."""
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, write(path, request.param)


@pytest.fixture(scope="module")
def dense_vision():
    return tiny_builtin(tiny_vision_config(), seed=3).model.encoder.vision_tower.state_dict()


def test_the_writer_lists_vision_linears_by_module_name(written):
    """The format itself, as the library writes it: explicit names, the `.linear` children, not the wrappers."""
    _, _, out = written
    ignore = out["config"]["ignore"]
    assert f"{VISION_Q}.linear" in ignore and VISION_Q not in ignore
    assert not any(n.startswith("re:") for n in ignore)
    assert "model.decoder.layers.0.router" in ignore and "lm_head" in ignore


@torch.no_grad()
def test_loads_through_from_pretrained_with_a_dense_vision_tower(written, dense_vision):
    preset, path, out = written
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    assert isinstance(model.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])
    tower = model.model.encoder.vision_tower
    assert type(tower.get_submodule("encoder.layers.0.self_attn.q_proj.linear")) is torch.nn.Linear
    for key, value in tower.state_dict().items():
        assert torch.equal(value, dense_vision[key]), key
    if preset == "FP8_DYNAMIC":  # the text stack computes what the library's fake quantization computed
        torch.testing.assert_close(model(input_ids=IDS, decoder_input_ids=CANVAS).logits, out["fake_quant_logits"],
                                   atol=1e-5, rtol=0)
    else:  # NVFP4: the one module takes the smaller input scale of its encoder and decoder twins (loading/twins.py)
        from safetensors.torch import load_file

        stored = load_file(path / "model.safetensors")
        for i in range(2):
            dec = stored[f"model.decoder.layers.{i}.mlp.up_proj.input_global_scale"]
            enc = stored[f"model.encoder.language_model.layers.{i}.mlp.up_proj.input_global_scale"]
            assert not torch.equal(dec, enc)  # the prompt and the canvas differ
            got = model.model.decoder.layers[i].mlp.up_proj.input_global_scale
            assert torch.equal(got, torch.minimum(dec, enc))


@torch.no_grad()
def test_nvfp4_with_twins_calibrated_alike_computes_the_library_fake_quantization(tmp_path):
    out = write(tmp_path, "NVFP4", shared_twins=True)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    torch.testing.assert_close(model(input_ids=IDS, decoder_input_ids=CANVAS).logits, out["fake_quant_logits"],
                               atol=1e-5, rtol=0)


@torch.no_grad()
def test_reads_images(written):
    _, path, _ = written
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    prompt = image_prompt(["see <x125>"], [[random_image(40, 60, 0)]], tiny_processor())
    torch.manual_seed(0)
    with_image = model.generate(**prompt, max_new_tokens=16, max_denoising_steps=3).sequences
    torch.manual_seed(0)
    text_only = model.generate(prompt["input_ids"], max_new_tokens=16, max_denoising_steps=3).sequences
    assert not torch.equal(with_image, text_only)


def test_loads_through_the_auto_class_and_pipeline(written):
    preset, path, _ = written
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    auto = AutoModelForCausalLM.from_pretrained(path)
    assert type(auto) is DiffusionGemmaForBlockDiffusion
    assert isinstance(auto.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])
    pipe = pipeline("text-generation", model=str(path), device="cpu")
    assert isinstance(pipe.model.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])
    runs = []
    for model in (ours, auto, pipe.model):
        torch.manual_seed(7)
        runs.append(model.generate(IDS, max_new_tokens=16, max_denoising_steps=3).sequences)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_quantize_refuses_it_as_already_quantized(written, tmp_path):
    _, path, _ = written
    with pytest.raises(ValueError, match=r"is already quantized \(compressed-tensors, format .*-quantized\)"):
        quantize_checkpoint(str(path), str(tmp_path / "again"), "fp8-dynamic")


def test_regex_ignore_keeps_loading(tmp_path):
    write(tmp_path, "NVFP4", ignore=["lm_head", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*",
                                     "re:.*self_conditioning.*"])
    raw = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    raw["ignore"] = ["lm_head", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*",
                     "re:.*self_conditioning.*"]  # model_free_ptq writes the recipe's own list
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = raw
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    assert isinstance(model.model.decoder.layers[0].mlp.up_proj, NVFP4Linear)
    assert type(model.get_submodule(f"{VISION_Q}.linear")) is torch.nn.Linear


def test_twin_copies_that_differ_are_refused_naming_the_key(tmp_path):
    from safetensors.torch import load_file, save_file

    write(tmp_path, "FP8_DYNAMIC")
    state = load_file(tmp_path / "model.safetensors")
    key = "model.encoder.language_model.layers.1.mlp.up_proj.weight_scale"
    state[key] = state[key] * 2
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(QuantizedCheckpointError, match=rf"{key} differs from model\.decoder\.layers\.1\.mlp"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
