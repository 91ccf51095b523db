"""Quantized text weights stored twice, as compressed-tensors writes them from transformers' built-in class.

The built-in class holds the text stack twice: encoder modules (`model.encoder.language_model.*`) and decoder modules
(`model.decoder.*`) that share each Parameter. `save_pretrained` writes a shared dense weight once, but LLM Compressor
compresses each module on its own, so every quantized text Linear of such a checkpoint has two sets of tensors: the
decoder's and its encoder-side twin. Our model has one stack, so the two sets must agree:

* the weight, its scales and the weight global scale are computed from the one shared weight: they must be equal,
  else the checkpoint is refused naming the key;
* NVFP4's `input_global_scale` (`448 · 6 / amax(input)`) is calibrated on what each module saw, the prompt for the
  encoder and the canvas for the decoder. Our one module sees both, so it takes the smaller scale, which is the scale
  of a calibration over both inputs.
"""

import torch

from diffusiongemma.modeling.weights import ENCODER_TEXT_PREFIX, NOT_SHARED, STACK_PREFIX

CALIBRATED = (".input_global_scale",)  # per-module activation statistics: the twins may differ


def encoder_twins(keys, mapping) -> dict[str, str]:
    """{our key: encoder-side checkpoint key} for every text tensor a checkpoint stores under both stack names.

    Only the usual layout (no `mapping`) can hold both: an encoder-layout checkpoint has no `model.decoder.layers`.
    """
    if mapping:
        return {}
    keys = set(keys)
    twins = {}
    for key in keys:
        if not key.startswith(ENCODER_TEXT_PREFIX):
            continue
        rest = key.removeprefix(ENCODER_TEXT_PREFIX)
        if not NOT_SHARED.match(rest) and STACK_PREFIX + rest in keys:
            twins[STACK_PREFIX + rest] = key
    return twins


def merged_twin(key: str, value: torch.Tensor, twin: torch.Tensor, twin_key: str) -> torch.Tensor | str:
    """The tensor our one module gets from a decoder-side `value` and its encoder-side `twin`, or a problem."""
    if key.endswith(CALIBRATED) and value.shape == twin.shape:
        return torch.minimum(value, twin.to(value.dtype))
    if value.shape != twin.shape or value.dtype != twin.dtype or not torch.equal(value, twin):
        return (f"{twin_key} differs from {key} (the encoder-side and decoder-side copies of one shared text weight "
                "must hold the same values)")
    return value
