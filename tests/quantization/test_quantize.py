"""`diffusiongemma quantize` (diffusiongemma/quantization/quantize.py, cli.py): what it writes, and who can read it."""

import copy
import json

import pytest
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
from safetensors.torch import load_file

from conftest import tiny_model, tiny_tokenizer
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.cli import main
from diffusiongemma.quantization.experts import unfuse_model_experts
from diffusiongemma.quantization.fp8 import FP8Linear
from diffusiongemma.quantization.nvfp4 import NVFP4Linear


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    model = tiny_model(seed=11)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path, model


def quantize(src, dst, *extra):
    assert main(["quantize", *extra, str(src), str(dst)]) == 0
    return json.loads((dst / "config.json").read_text())["quantization_config"], load_file(dst / "model.safetensors")


def mean_kl(model, reference) -> float:
    g = torch.Generator().manual_seed(0)
    ids, canvas = torch.randint(3, 128, (2, 9), generator=g), torch.randint(0, 128, (2, 16), generator=g)
    with torch.no_grad():
        q = model(input_ids=ids, decoder_input_ids=canvas).logits.log_softmax(-1)
        p = reference(input_ids=ids, decoder_input_ids=canvas).logits.log_softmax(-1)
    return (p.exp() * (p - q)).sum(-1).mean().item()


def test_fp8_cli_writes_the_published_layout_and_loads(src, tmp_path):
    path, dense = src
    config, tensors = quantize(path, tmp_path, "--scheme", "fp8-dynamic")
    # spec F / F.1: the JSON compressed-tensors itself writes
    assert config["quant_method"] == "compressed-tensors" and config["quantization_status"] == "compressed"
    assert config["format"] == "float-quantized" and list(config["config_groups"]) == ["group_0"]
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and group["output_activations"] is None
    assert {k: group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric", "dynamic")} == dict(
        num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    assert group["input_activations"]["strategy"] == "token" and group["input_activations"]["dynamic"] is True
    assert "lm_head" in config["ignore"] and any("router" in i for i in config["ignore"])
    for part in ("vision_tower", "self_conditioning", "embed_vision", "embed_tokens"):
        assert any(part in i for i in config["ignore"]), part
    assert config["sparsity_config"] == {} and "version" in config
    # per-expert Linears, quantized; routers, self-conditioning, vision stay dense; lm_head stays tied (not saved)
    e = "model.decoder.layers.3.experts.2."
    assert tensors[e + "gate_proj.weight"].dtype == torch.float8_e4m3fn and tensors[e + "down_proj.weight_scale"].shape == (64, 1)
    assert "model.decoder.layers.3.experts.gate_up_proj" not in tensors and "lm_head.weight" not in tensors
    assert tensors["model.decoder.layers.0.router.proj.weight"].dtype == torch.float32
    assert tensors["model.decoder.self_conditioning.gate_proj.weight"].dtype == torch.float32
    # gate = first half of the fused rows, up = second half
    fused = dense.model.decoder.layers[3].experts.gate_up_proj[2].detach()
    gate = tensors[e + "gate_proj.weight"].float() * tensors[e + "gate_proj.weight_scale"]
    up = tensors[e + "up_proj.weight"].float() * tensors[e + "up_proj.weight_scale"]
    torch.testing.assert_close(torch.cat([gate, up]), fused, atol=2e-3, rtol=0.07)

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    assert isinstance(model.model.decoder.layers[3].experts[2].up_proj, FP8Linear)
    kl = mean_kl(model, dense)
    print(f"\nfp8-dynamic via CLI: mean KL(orig || quantized) {kl:.5f}")
    assert kl < 0.5


def test_nvfp4_cli_calibrates_with_the_tokenizer_and_a_prompt_file(src, tmp_path):
    path, dense = src
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat sat on the mat\n")
    config, tensors = quantize(path, tmp_path / "out", "--scheme", "nvfp4", "--calibration-file", str(prompts))
    group = config["config_groups"]["group_0"]
    assert config["format"] == "nvfp4-pack-quantized" and group["weights"]["group_size"] == 16
    assert group["input_activations"]["dynamic"] == "local"
    p = "model.decoder.layers.0."
    assert tensors[p + "experts.1.gate_proj.weight_packed"].shape == (32, 32)  # [I, H/2]
    assert tensors[p + "experts.1.gate_proj.weight_scale"].dtype == torch.float8_e4m3fn
    # every expert calibrated (all tokens through all experts), gate/up share the weight global scale (spec F.4)
    for e in range(4):
        assert 0 < tensors[p + f"experts.{e}.down_proj.input_global_scale"].item() < 1e6
        assert torch.equal(tensors[p + f"experts.{e}.gate_proj.weight_global_scale"],
                           tensors[p + f"experts.{e}.up_proj.weight_global_scale"])
    assert (tmp_path / "out" / "tokenizer_config.json").exists()
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "out")
    assert isinstance(model.model.decoder.layers[0].experts[1].gate_proj, NVFP4Linear)
    kl = mean_kl(model, dense)
    print(f"\nnvfp4 via CLI: mean KL(orig || quantized) {kl:.5f}")
    assert kl < 0.5


@pytest.mark.parametrize("scheme", ["fp8-dynamic", "nvfp4"])
def test_compressed_tensors_model_compressor_decompresses_what_we_write(src, tmp_path, scheme):
    path, dense = src
    config, tensors = quantize(path, tmp_path, "--scheme", scheme)
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    # the library's own route: attach the scheme to a dense model, put it in compressed form, load our tensors
    model = unfuse_model_experts(copy.deepcopy(dense))
    qconfig = QuantizationConfig.model_validate({k: v for k, v in config.items() if k in QuantizationConfig.model_fields})
    apply_quantization_config(model, qconfig, show_progress=False)
    compressor = ModelCompressor(quantization_config=qconfig)
    compressor.compress_model(model)
    state = model.state_dict()
    for key in state:
        if key in tensors:
            state[key].copy_(tensors[key])
    compressor.decompress_model(model)
    names = ["model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.5.experts.3.down_proj",
             "model.decoder.layers.2.mlp.up_proj"]
    for name in names:
        library = model.get_submodule(name).weight.detach().float()
        mine = ours.get_submodule(name).dequantized_weight(torch.float32)
        torch.testing.assert_close(library, mine, rtol=1e-2, atol=1e-5)  # NVFP4 decompresses through bf16 (F.4)
