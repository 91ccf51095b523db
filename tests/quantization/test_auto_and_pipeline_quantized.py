"""Quantized checkpoints through transformers' doors: `AutoModelForCausalLM.from_pretrained` and
`pipeline("text-generation", model=path)` on FP8 and NVFP4 compressed-tensors folders and on bitsandbytes, giving the
tokens of `DiffusionGemmaForBlockDiffusion.from_pretrained` (diffusiongemma/loading/compressed.py, model.py).

The folders name transformers' class in `architectures`, as published checkpoints do: when our loading fails under a
pipeline, the pipeline would retry with the built-in class, which loads a compressed-tensors folder with random
weights. That retry must never happen.
"""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, pipeline

from conftest import tiny_config, tiny_model, tiny_tokenizer
from ct_checkpoint import REGEX_IGNORE, write_compressed_checkpoint
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma import PipelineLoadError
from diffusiongemma.quantization.fp8 import FP8Linear
from diffusiongemma.quantization.nvfp4 import NVFP4Linear

LINEAR = {"FP8_DYNAMIC": FP8Linear, "NVFP4": NVFP4Linear}


def published_folder(path, preset):
    """A compressed-tensors folder like a published one: checkpoint, `architectures`, tokenizer."""
    write_compressed_checkpoint(tiny_model(seed=3), path, preset, REGEX_IGNORE)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["DiffusionGemmaForBlockDiffusion"]
    (path / "config.json").write_text(json.dumps(config))
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=list(LINEAR))
def folder(request, tmp_path_factory):
    return request.param, published_folder(tmp_path_factory.mktemp(request.param), request.param)


def generated(model, ids, seed=7):
    torch.manual_seed(seed)
    return model.generate(ids, max_new_tokens=16, max_denoising_steps=3).sequences


IDS = torch.tensor([[5, 40, 41, 42, 43, 9]])


def test_auto_class_loads_compressed_and_gives_our_tokens(folder):
    preset, path = folder
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    auto = AutoModelForCausalLM.from_pretrained(path)
    assert type(auto) is DiffusionGemmaForBlockDiffusion
    assert isinstance(auto.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])
    assert torch.equal(generated(auto, IDS), generated(ours, IDS))


def test_auto_class_passes_dtype_and_torch_dtype(folder):
    _, path = folder
    for kwargs in ({"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16}):
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        assert model.model.decoder.embed_tokens.weight.dtype == torch.bfloat16


def test_pipeline_loads_compressed_and_gives_our_text(folder):
    preset, path = folder
    tok = tiny_tokenizer()
    pipe = pipeline("text-generation", model=str(path), device="cpu")  # a plain load can be placed by the pipeline
    assert type(pipe.model) is DiffusionGemmaForBlockDiffusion
    assert isinstance(pipe.model.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])
    torch.manual_seed(0)
    text = pipe("hello", max_new_tokens=16, max_denoising_steps=3)[0]["generated_text"]
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    torch.manual_seed(0)
    ids = tok("hello", return_tensors="pt")["input_ids"]
    direct = ours.generate(ids, max_new_tokens=16, max_denoising_steps=3, pad_token_id=tok.pad_token_id)
    assert text == tok.decode(direct.sequences[0], skip_special_tokens=True)


def test_pipeline_never_falls_back_to_the_builtin_class(folder):
    """An option our loader cannot honour stops the pipeline with our message; without the guard the pipeline
    retries with transformers' class, which reports ~50 key groups as missing and initializes them at random."""
    _, path = folder
    with pytest.raises(PipelineLoadError, match=r"does not support \['offload_state_dict'\]"):
        pipeline("text-generation", model=str(path), model_kwargs={"offload_state_dict": True})


def test_options_the_loader_cannot_honour_are_errors(folder):
    _, path = folder
    with pytest.raises(TypeError, match="use_safetensors=False"):
        AutoModelForCausalLM.from_pretrained(path, use_safetensors=False)
    with pytest.raises(TypeError, match="PEFT adapter"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(path, adapter_kwargs={"_adapter_model_path": str(path)})
    with pytest.raises(TypeError, match="max_memory is used by the automatic device maps"):
        AutoModelForCausalLM.from_pretrained(path, max_memory={"cpu": "1GiB"})
    with pytest.raises(TypeError, match="pass only dtype"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.float32, torch_dtype=torch.bfloat16)


def test_experts_implementation_switch(folder):
    _, path = folder
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="grouped_mm")
    assert torch.equal(generated(model, IDS), generated(DiffusionGemmaForBlockDiffusion.from_pretrained(path), IDS))
    with pytest.raises(ValueError, match="accepted: None, 'grouped_mm' or 'eager'.*got 'batched_mm'"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(path, experts_implementation="batched_mm")


def test_subfolder_is_honoured(folder, tmp_path):
    preset, path = folder
    shutil.copytree(path, tmp_path / "quantized")
    model = AutoModelForCausalLM.from_pretrained(tmp_path, subfolder="quantized")
    assert isinstance(model.model.decoder.layers[0].self_attn.q_proj, LINEAR[preset])


# ---- bitsandbytes: a bf16 folder quantized at load time, and a folder saved quantized ----

@pytest.fixture(scope="module")
def bnb_folders(tmp_path_factory):
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    from transformers import BitsAndBytesConfig

    dense = tmp_path_factory.mktemp("dense")
    model = tiny_model(tiny_config(intermediate_size=128, head_dim=32, global_head_dim=64), seed=4)
    model.config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    model.save_pretrained(dense)
    tiny_tokenizer().save_pretrained(dense)
    try:
        ours = DiffusionGemmaForBlockDiffusion.from_pretrained(
            dense, quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="cpu")
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"bitsandbytes {bnb.__version__} cannot run 8-bit on this CPU: {err}")
    saved = tmp_path_factory.mktemp("bnb8")
    ours.save_pretrained(saved)
    tiny_tokenizer().save_pretrained(saved)
    return dense, saved, ours, BitsAndBytesConfig


def test_bitsandbytes_through_auto_and_pipeline_gives_our_tokens(bnb_folders):
    import bitsandbytes as bnb

    dense, saved, ours, config_class = bnb_folders
    expected = generated(ours, IDS)
    auto = AutoModelForCausalLM.from_pretrained(dense, quantization_config=config_class(load_in_8bit=True),
                                                device_map="cpu")
    reloaded = AutoModelForCausalLM.from_pretrained(saved)
    for model in (auto, reloaded):
        assert type(model) is DiffusionGemmaForBlockDiffusion
        assert isinstance(model.model.decoder.layers[0].self_attn.q_proj, bnb.nn.Linear8bitLt)
        assert type(model.lm_head) is torch.nn.Linear  # our skip list, also through the Auto class
        assert torch.equal(generated(model, IDS), expected)
    pipe = pipeline("text-generation", model=str(saved))
    assert isinstance(pipe.model.model.decoder.layers[0].self_attn.q_proj, bnb.nn.Linear8bitLt)
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    text = pipe("hello", max_new_tokens=16, max_denoising_steps=3)[0]["generated_text"]
    torch.manual_seed(0)
    ids = tok("hello", return_tensors="pt")["input_ids"]
    direct = ours.generate(ids, max_new_tokens=16, max_denoising_steps=3, pad_token_id=tok.pad_token_id)
    assert text == tok.decode(direct.sequences[0], skip_special_tokens=True)


def test_native_fp8_error_names_the_loading_argument(folder):
    preset, path = folder
    if preset != "FP8_DYNAMIC" or (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)):
        pytest.skip("FP8 folders on machines without FP8 tensor cores only")
    with pytest.raises(RuntimeError, match=r"Use fp8_kernel='auto' or fp8_kernel='dequant'"):  # was: kernel='auto'
        AutoModelForCausalLM.from_pretrained(path, fp8_kernel="scaled_mm")
