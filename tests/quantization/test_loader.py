"""Loading compressed-tensors checkpoints built by compressed-tensors itself (diffusiongemma/loading/compressed.py).

Each test quantizes a tiny model with the library, saves it in the published layout (per-expert Linears, spec F.3)
or the fused one, loads it with `DiffusionGemmaForBlockDiffusion.from_pretrained` and compares with a plain model
holding the dequantized weights and the same activation quantization.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import tiny_model
from ct_checkpoint import REGEX_IGNORE, dequantized_reference, explicit_ignore, write_compressed_checkpoint
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.quantization.experts import ExpertList
from diffusiongemma.quantization.fp8 import FP8Linear
from diffusiongemma.quantization.nvfp4 import NVFP4Linear
from diffusiongemma.quantization.schemes import QuantizedCheckpointError

@pytest.fixture(scope="module")
def base():
    return tiny_model(seed=3)


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 128, (2, 9), generator=g), torch.randint(0, 128, (2, 16), generator=g)


def logits(model, ids, canvas):
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=canvas).logits


def generated(model, ids):
    torch.manual_seed(7)
    out = model.generate(ids, max_new_tokens=16, max_denoising_steps=4)
    return out.sequences if hasattr(out, "sequences") else out


def weight_bytes(model) -> int:
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


@pytest.mark.parametrize("preset, style", [
    ("FP8_DYNAMIC", "explicit"),  # LLM Compressor one-shot ignore list (module names)
    ("FP8_DYNAMIC", "explicit-encoder-names"),  # names and tensors under model.encoder.language_model.*
    ("NVFP4", "regex"),  # model_free_ptq-style regex ignore list
])
def test_per_expert_checkpoint_matches_dequantized_model(base, tmp_path, preset, style):
    encoder = style == "explicit-encoder-names"
    ignore = REGEX_IGNORE if style == "regex" else explicit_ignore(
        base, "model.encoder.language_model." if encoder else "model.decoder.")
    ckpt = write_compressed_checkpoint(base, tmp_path, preset, ignore, encoder_layout=encoder)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)

    layer = model.model.decoder.layers[0]
    quantized = FP8Linear if preset == "FP8_DYNAMIC" else NVFP4Linear
    assert isinstance(layer.experts, ExpertList) and isinstance(layer.experts[3].down_proj, quantized)
    assert isinstance(layer.self_attn.q_proj, quantized) and isinstance(layer.router.proj, torch.nn.Linear)
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert not isinstance(model.model.decoder.self_conditioning.gate_proj, quantized)
    n_linear = 6 * (3 + 3 + 4 * 3) + 5  # per layer q,k,o + mlp + 4 experts x 3; sliding layers add v_proj
    assert sum(isinstance(m, quantized) for m in model.modules()) == n_linear == len(ckpt["dequantized"])

    # compressed in memory: resident weights within 1.15x of the tensors on disk
    disk = sum(t.numel() * t.element_size() for t in load_file(tmp_path / "model.safetensors").values())
    assert weight_bytes(model) <= 1.15 * disk

    reference = dequantized_reference(base, ckpt["dequantized"], preset, ckpt["input_scales"])
    ids, canvas = inputs()
    torch.testing.assert_close(logits(model, ids, canvas), logits(reference, ids, canvas), atol=1e-4, rtol=1e-4)
    assert torch.equal(generated(model, ids[:1]), generated(reference, ids[:1]))

    # sanity figure vs the unquantized model (printed, loose bound only)
    q, p = logits(model, ids, canvas).log_softmax(-1), logits(base, ids, canvas).log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).mean().item()
    top1 = (p.argmax(-1) == q.argmax(-1)).float().mean().item()
    print(f"\n{preset} {style}: mean KL(orig || quantized) {kl:.5f}, top-1 agreement {top1:.3f}")
    assert kl < 0.5


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "NVFP4A16"])
def test_fused_expert_checkpoint_keeps_dense_3d_experts(base, tmp_path, preset):
    ckpt = write_compressed_checkpoint(base, tmp_path, preset, REGEX_IGNORE, unfuse=False)
    assert "model.decoder.layers.0.experts.gate_up_proj" in load_file(tmp_path / "model.safetensors")
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)
    assert not isinstance(model.model.decoder.layers[0].experts, ExpertList)
    q_proj = model.model.decoder.layers[0].self_attn.q_proj
    if preset == "FP8_DYNAMIC":
        assert isinstance(q_proj, FP8Linear)
    else:  # NVFP4A16: weight-only, so no static activation scale
        assert isinstance(q_proj, NVFP4Linear) and q_proj.input_global_scale is None
    ids, canvas = inputs()
    reference = dequantized_reference(base, ckpt["dequantized"], preset, ckpt["input_scales"])
    torch.testing.assert_close(logits(model, ids, canvas), logits(reference, ids, canvas), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def fp8_folder(base, tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8")
    write_compressed_checkpoint(base, path, "FP8_DYNAMIC", REGEX_IGNORE)
    return path


def copy_with(src, dst, edit_tensors=None, edit_config=None):
    tensors = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config["quantization_config"])
    dst.mkdir(exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_missing_expert_weight_is_an_error_naming_the_key(fp8_folder, tmp_path):
    key = "model.decoder.layers.2.experts.1.down_proj.weight"
    bad = copy_with(fp8_folder, tmp_path / "bad", lambda t: t.pop(key))
    with pytest.raises(QuantizedCheckpointError, match=key.replace(".", r"\.")):
        DiffusionGemmaForBlockDiffusion.from_pretrained(bad)


def test_missing_tensor_of_an_encoder_layout_checkpoint_is_named_as_stored(base, tmp_path):
    ignore = explicit_ignore(base, "model.encoder.language_model.")
    write_compressed_checkpoint(base, tmp_path / "enc", "FP8_DYNAMIC", ignore, encoder_layout=True)
    key = "model.encoder.language_model.layers.1.mlp.up_proj.weight_scale"
    bad = copy_with(tmp_path / "enc", tmp_path / "bad", lambda t: t.pop(key))
    with pytest.raises(QuantizedCheckpointError, match=r"missing tensors \(1\): \['" + key.replace(".", r"\.")):
        DiffusionGemmaForBlockDiffusion.from_pretrained(bad)


def test_mis_shaped_scale_is_an_error_naming_the_key(fp8_folder, tmp_path):
    key = "model.decoder.layers.0.self_attn.q_proj.weight_scale"
    bad = copy_with(fp8_folder, tmp_path / "bad", lambda t: t.update({key: t[key][:-1]}))
    with pytest.raises(QuantizedCheckpointError, match=r"q_proj\.weight_scale \(checkpoint \(63, 1\)"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(bad)


def test_missing_scale_is_an_error(fp8_folder, tmp_path):
    key = "model.decoder.layers.1.experts.0.gate_proj.weight_scale"
    bad = copy_with(fp8_folder, tmp_path / "bad", lambda t: t.pop(key))
    with pytest.raises(QuantizedCheckpointError, match="missing tensors.*experts\\.0\\.gate_proj\\.weight_scale"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(bad)


def test_dense_weight_where_config_says_fp8_is_an_error(fp8_folder, tmp_path):
    key = "model.decoder.layers.0.mlp.up_proj.weight"
    bad = copy_with(fp8_folder, tmp_path / "bad", lambda t: t.update({key: t[key].float()}))
    with pytest.raises(QuantizedCheckpointError, match=r"mlp\.up_proj\.weight \(checkpoint dtype torch\.float32"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(bad)


def int4(config):
    config["config_groups"]["group_0"]["weights"].update(num_bits=4, type="int", strategy="group", group_size=128)
    config["config_groups"]["group_0"]["input_activations"] = None
    config["format"] = "pack-quantized"


@pytest.mark.parametrize("edit, message", [
    (int4, r"unsupported scheme \(weights: 4-bit int.*Supported: FP8 dynamic.*diffusiongemma quantize"),
    (lambda c: c.update(format="float-quantized-v9"), r"format is 'float-quantized-v9'.*Supported"),
    (lambda c: c.update(quant_method="modelopt"), r"quant_method='modelopt'.*compressed-tensors"),
    (lambda c: c.update(quantization_status="frozen"), r"quantization_status='frozen'"),
])
def test_unsupported_configs_give_clear_errors(fp8_folder, tmp_path, edit, message):
    bad = copy_with(fp8_folder, tmp_path / "bad", edit_config=edit)
    from diffusiongemma.loading.compressed import load_compressed_tensors_checkpoint

    with pytest.raises(QuantizedCheckpointError, match=message):
        load_compressed_tensors_checkpoint(DiffusionGemmaForBlockDiffusion, bad)


def test_native_fp8_request_without_fp8_hardware_is_a_clear_error(fp8_folder):
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        pytest.skip("this machine has FP8 tensor cores")
    with pytest.raises(RuntimeError, match=r"Native FP8 matmul.*requested on device 'cpu'.*kernel='auto'"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(fp8_folder, fp8_kernel="scaled_mm")


def test_dtype_argument_casts_dense_weights_and_keeps_fp8(fp8_folder):
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(fp8_folder, dtype=torch.bfloat16)
    q = model.model.decoder.layers[0].self_attn.q_proj
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight_scale.dtype == torch.bfloat16
    assert model.model.decoder.embed_tokens.weight.dtype == torch.bfloat16
    ids, canvas = inputs()
    assert torch.isfinite(logits(model, ids, canvas)).all()


def test_hub_repo_id_is_fetched_and_loaded_compressed(fp8_folder, monkeypatch):
    """A repo id whose config.json is compressed-tensors goes to our loader after a snapshot download (simulated:
    no network here)."""
    import os

    from diffusiongemma.loading import compressed as loader
    from diffusiongemma.quantization.fp8 import FP8Linear

    calls = []

    def fake_cached_file(repo, name, **kwargs):
        calls.append(("config", repo, kwargs.get("revision")))
        return os.path.join(str(fp8_folder), name)

    def fake_snapshot(repo, allow_patterns=None, **kwargs):
        calls.append(("snapshot", repo, kwargs.get("revision")))
        return str(fp8_folder)

    monkeypatch.setattr(loader, "cached_file", fake_cached_file)
    monkeypatch.setattr(loader, "snapshot_download", fake_snapshot)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained("RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic",
                                                            revision="main")
    assert calls == [("config", "RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic", "main"),
                     ("snapshot", "RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic", "main")]
    assert isinstance(model.model.decoder.layers[0].self_attn.q_proj, FP8Linear)


def test_unsupported_loading_option_is_an_error(fp8_folder):
    with pytest.raises(TypeError, match=r"does not support \['key_mapping'\]"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(fp8_folder, key_mapping={"a": "b"})
