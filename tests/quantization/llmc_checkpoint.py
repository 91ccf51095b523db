"""Checkpoints as a one-shot LLM Compressor run writes them: compressed-tensors run on transformers' built-in class.

LLM Compressor quantizes the model transformers builds (the built-in `DiffusionGemmaForBlockDiffusion`), then saves
with `ModelCompressor.from_pretrained_model` and `compress_model`. The library itself derives the `ignore` list it
writes from that model: every module of a quantized type left unquantized, by name (spec F.4), so the vision tower's
entries are its `Gemma4ClippableLinear`s' `.linear` children. The built-in class holds the text stack twice (encoder
and decoder modules sharing parameters), and each copy is compressed (diffusiongemma/loading/twins.py).

The steps: `apply_quantization_config` with the recipe's regex ignore list, weight calibration with the library's
`calculate_qparams` / `generate_gparam`, NVFP4 input global scales from the activations of one forward pass (each
module its own), `compress_model`, `save_pretrained`, `update_config`.
"""

import json

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.helpers import disable_quantization, enable_quantization
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

RECIPE_IGNORE = ["lm_head", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*", "re:.*self_conditioning.*"]


def _input_amax(model, ids: torch.Tensor, canvas: torch.Tensor) -> dict:
    amax, handles = {}, []
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None:
            def hook(m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().amax()))
            handles.append(module.register_forward_pre_hook(hook))
    model.apply(disable_quantization)  # observe the dense activations, as LLM Compressor's calibration does
    with torch.no_grad():
        model(input_ids=ids, decoder_input_ids=canvas)
    model.apply(enable_quantization)
    for h in handles:
        h.remove()
    return amax


def calibrate(model, preset: str, ids: torch.Tensor, canvas: torch.Tensor, shared_twins: bool = False) -> None:
    """Fill the weight scales (and NVFP4 global / input global scales) compressed-tensors attached to `model`;
    `shared_twins`: an encoder module and its decoder twin get the input scale of both their inputs."""
    amax = _input_amax(model, ids, canvas) if preset == "NVFP4" else {}
    if shared_twins:
        for name in list(amax):
            twin = name.replace("model.encoder.language_model.", "model.decoder.")
            if twin != name and twin in amax:
                amax[name] = amax[twin] = max(amax[name], amax[twin])
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
            a = torch.tensor(amax[name])
            module.input_global_scale.data.copy_(generate_gparam(-a, a))
        module.weight_scale.data.copy_(scale)


def write_llm_compressor_checkpoint(builtin, path, preset: str, ignore=RECIPE_IGNORE, fake_quant_inputs=None,
                                    shared_twins: bool = False) -> dict:
    """Quantize the built-in model `builtin` in place with compressed-tensors and save it at `path` (a Path).

    Args:
        preset: "FP8_DYNAMIC" or "NVFP4".
        ignore: the recipe's ignore list (the written one is the library's explicit list).
        fake_quant_inputs: optional forward kwargs; their logits under the library's fake quantization (after
            calibration, before compression) are returned.
        shared_twins: see `calibrate` (what our one module computes; by default each twin keeps its own).

    Returns:
        {"config": the written quantization_config, "fake_quant_logits": tensor or None}.
    """
    qconfig = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                                 ignore=list(ignore))
    apply_quantization_config(builtin, qconfig, show_progress=False)
    g = torch.Generator().manual_seed(0)
    calibrate(builtin, preset, torch.randint(3, 100, (1, 12), generator=g), torch.randint(3, 100, (1, 16), generator=g),
              shared_twins)
    fake_quant_logits = None
    if fake_quant_inputs is not None:
        with torch.no_grad():
            fake_quant_logits = builtin(**fake_quant_inputs).logits
    compressor = ModelCompressor.from_pretrained_model(builtin)
    compressor.compress_model(builtin)
    builtin.save_pretrained(path)
    compressor.update_config(str(path))
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    return {"config": config, "fake_quant_logits": fake_quant_logits}
