"""Build compressed-tensors checkpoints of tiny models with compressed-tensors itself (not with our writer).

The pipeline is LLM Compressor's without LLM Compressor: `apply_quantization_config` attaches the preset, weights
are calibrated with the library's `calculate_qparams` / `generate_gparam`, NVFP4 input global scales from the
activations of a calibration pass, then `ModelCompressor.compress_model` produces the checkpoint tensors and
`ModelCompressor.update_config` writes the `quantization_config`.
"""

import copy
import json
import re

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import forward_quantize
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import save_file
from torch import nn

from diffusiongemma.modeling.vision_linear import AdaptableClippableLinear
from diffusiongemma.quantization.experts import unfuse_model_experts
from diffusiongemma.quantization.fp8 import dequantize_fp8_weight, quantize_fp8_per_token
from diffusiongemma.quantization.nvfp4 import dequantize_nvfp4_weight, quantize_dequantize_nvfp4_activation

REGEX_IGNORE = ["lm_head", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*", "re:.*self_conditioning.*"]


def explicit_ignore(model: nn.Module, prefix: str = "model.decoder.") -> list[str]:
    """LLM Compressor one-shot style (spec F.4): every Linear-like module left unquantized, by name, including the
    router module itself; text-stack names written under `prefix`. Names are those of the built-in class: a vision
    linear is its `.linear` child, never our `AdaptableClippableLinear` wrapper (which the built-in does not have)."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, AdaptableClippableLinear):
            continue
        linear_like = isinstance(module, nn.Linear) or "Router" in type(module).__name__
        if linear_like and re.search(r"router|vision_tower|embed_vision|self_conditioning|lm_head", name):
            names.append(name.replace("model.decoder.", prefix) if "self_conditioning" not in name else name)
    return names


def _calibrate_inputs(model: nn.Module, ids: torch.Tensor) -> dict:
    amax, handles = {}, []
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None:
            def hook(m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().amax()))
            handles.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for e_list in [m for m in model.modules() if type(m).__name__ == "ExpertList"]:  # all experts see all tokens
            handles.append(e_list.register_forward_pre_hook(lambda m, a: [expert(a[0]) for expert in m] and None))
        model(input_ids=ids)
    for h in handles:
        h.remove()
    return amax


def write_compressed_checkpoint(model: nn.Module, path, preset: str, ignore: list[str], unfuse: bool = True,
                                encoder_layout: bool = False, calibration_ids: torch.Tensor | None = None) -> dict:
    """Quantize a copy of `model` with compressed-tensors and save it as a checkpoint folder at `path`.

    Args:
        preset: "FP8_DYNAMIC", "NVFP4" or "NVFP4A16".
        ignore: the `ignore` list (names as in the saved keys).
        unfuse: split experts into per-expert Linears (the published layout) so they are quantized too; False keeps
            the fused 3-D parameters (dense).
        encoder_layout: save text-stack tensors under `model.encoder.language_model.*` instead of `model.decoder.*`.

    Returns:
        {"dequantized": {Linear name: dense weight fp32}, "input_scales": {Linear name: [1]}, "config": dict}.
    """
    model = copy.deepcopy(model)
    if unfuse:
        unfuse_model_experts(model)
    rename = (lambda n: n.replace("model.decoder.", "model.encoder.language_model.", 1)
              if n.startswith("model.decoder.") and "self_conditioning" not in n else n) if encoder_layout else None
    qconfig = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                                 ignore=[n for n in ignore])
    if encoder_layout:  # the library matches our module names; translate the ignore list for it
        qconfig.ignore = [n.replace("model.encoder.language_model.", "model.decoder.") for n in ignore]
    # the library takes our vision wrappers for Linears (they are, to isinstance): it must skip them; the config
    # written below keeps `ignore` as given
    qconfig.ignore += ["AdaptableClippableLinear"]
    apply_quantization_config(model, qconfig, show_progress=False)
    amax = _calibrate_inputs(model, calibration_ids if calibration_ids is not None else torch.randint(3, 100, (1, 12)))
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        w = module.weight.detach()
        if preset == "FP8_DYNAMIC":
            scale, _ = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
        else:
            g = generate_gparam(w.amin(), w.amax())
            module.weight_global_scale.data.copy_(g)
            groups = w.unflatten(-1, (-1, 16))
            scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights, global_scale=g)
            if scheme.input_activations is not None:
                a = torch.tensor(amax.get(name, 1.0))
                module.input_global_scale.data.copy_(generate_gparam(-a, a))
        module.weight_scale.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    dequantized, input_scales = {}, {}
    for key in state:
        if key.endswith(".input_global_scale"):
            input_scales[key.removesuffix(".input_global_scale")] = state[key]
        if key.endswith(".weight_scale"):
            m = key.removesuffix(".weight_scale")
            if m + ".weight_packed" in state:
                dequantized[m] = dequantize_nvfp4_weight(state[m + ".weight_packed"], state[key],
                                                         state[m + ".weight_global_scale"], torch.float32)
            else:
                dequantized[m] = dequantize_fp8_weight(state[m + ".weight"], state[key], torch.float32)
    if rename:
        state = {rename(k) if not re.search(r"layers\.\d+\.layer_scalar$", k) else k: v for k, v in state.items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("quantization_config", None)
    (path / "config.json").write_text(json.dumps(raw))
    compressor.quantization_config.ignore = list(ignore)
    compressor.update_config(str(path))
    return {"dequantized": dequantized, "input_scales": input_scales, "config": json.loads((path / "config.json").read_text())["quantization_config"]}


def dequantized_reference(model: nn.Module, dequantized: dict, preset: str, input_scales: dict | None = None
                          ) -> nn.Module:
    """A plain (dense) copy of `model` holding the dequantized weights, with the checkpoint's activation
    quantization applied by forward pre-hooks (FP8: per token; NVFP4: static global + per-16 group scales)."""
    ref = unfuse_model_experts(copy.deepcopy(model))
    for name, module in ref.named_modules():
        if name not in dequantized:
            continue
        module.weight.data = dequantized[name].to(module.weight.dtype)
        if preset == "FP8_DYNAMIC":
            module.register_forward_pre_hook(
                lambda m, a: ((lambda q, s: q.to(a[0].dtype) * s)(*quantize_fp8_per_token(a[0])),))
        elif preset == "NVFP4":
            g = input_scales[name]
            module.register_forward_pre_hook(lambda m, a, g=g: (quantize_dequantize_nvfp4_activation(a[0], g),))
    return ref


def library_pipeline_outputs(model: nn.Sequential, x: torch.Tensor) -> dict:
    """What compressed-tensors itself does with a calibrated one-Linear `model`: its fake-quant forward on `x`, its
    input fake-quantization, the tensors `ModelCompressor` writes (a checkpoint's) and its decompressed weight."""
    module = model[0]
    with torch.no_grad():
        fake_quant_output = model(x)
        input_fake_quant = forward_quantize(module, x, "input", module.quantization_scheme.input_activations)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    compressed = {k.removeprefix("0."): v.detach().clone() for k, v in model.state_dict().items()}
    compressor.decompress_model(model)
    return {
        "format": compressor.quantization_config.format,
        "compressed": compressed,
        "decompressed_weight": model[0].weight.detach().clone(),
        "fake_quant_output": fake_quant_output,
        "input_fake_quant": input_fake_quant,
    }
