"""Quantized formats (spec F): compressed-tensors FP8-dynamic and NVFP4, as pure functions and Linear modules."""

from diffusiongemma.quantization.fp8 import (
    FP8Linear,
    check_fp8_supported,
    dequantize_fp8_weight,
    fp8_linear,
    fp8_linear_dequant,
    fp8_linear_scaled_mm,
    native_fp8_available,
    quantize_fp8_per_token,
    quantize_fp8_weight,
)
from diffusiongemma.quantization.nvfp4 import (
    NVFP4Linear,
    dequantize_nvfp4_weight,
    e2m1_to_float,
    float_to_e2m1,
    nvfp4_global_scale,
    nvfp4_group_scales,
    nvfp4_linear,
    pack_fp4,
    quantize_dequantize_nvfp4_activation,
    quantize_nvfp4_weight,
    unpack_fp4,
)

__all__ = [
    "FP8Linear",
    "NVFP4Linear",
    "check_fp8_supported",
    "dequantize_fp8_weight",
    "dequantize_nvfp4_weight",
    "e2m1_to_float",
    "float_to_e2m1",
    "fp8_linear",
    "fp8_linear_dequant",
    "fp8_linear_scaled_mm",
    "native_fp8_available",
    "nvfp4_global_scale",
    "nvfp4_group_scales",
    "nvfp4_linear",
    "pack_fp4",
    "quantize_dequantize_nvfp4_activation",
    "quantize_fp8_per_token",
    "quantize_fp8_weight",
    "quantize_nvfp4_weight",
    "unpack_fp4",
]
