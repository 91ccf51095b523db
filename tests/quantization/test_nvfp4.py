"""Tests for diffusiongemma/quantization/nvfp4.py, checked against compressed-tensors itself (spec F.2, F.4).

Legend: O out_features, I in_features, G = I/16 groups.
"""

import copy

import pytest
import torch
from compressed_tensors.compressors.nvfp4.helpers import (
    pack_fp4_to_uint8,
    quantize_and_pack_fp4,
    unpack_fp4_from_uint8,
)
from compressed_tensors.quantization import (
    FP4_E2M1_DATA,
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from torch import nn

from ct_checkpoint import library_pipeline_outputs

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

FP8 = torch.float8_e4m3fn
ALL_CODES_AS_FLOATS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def tiny_linear(dtype: torch.dtype, bias: bool = True, in_features: int = 64, out_features: int = 24) -> nn.Linear:
    """Random Linear with an all-zero group (zero FP8 scale edge case) and an outlier (small-scale groups)."""
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    with torch.no_grad():
        linear.weight[5, :16] = 0.0
        linear.weight[2, 40] = 4.0
    return linear


def compress_with_compressed_tensors(linear: nn.Linear, x: torch.Tensor) -> dict:
    """Run compressed-tensors' own NVFP4 pipeline on a copy of `linear`.

    compressed-tensors has no observers (LLM Compressor does), so calibration uses the library's `generate_gparam`
    (global scales, from the whole weight and from `x`) and `calculate_qparams` (per-16 group FP8 scales). Then the
    library's fake-quant forward runs on `x`, `ModelCompressor` compresses and decompresses.
    """
    model = nn.Sequential(copy.deepcopy(linear))
    apply_quantization_config(model, QuantizationConfig(config_groups={"NVFP4": ["Linear"]}), show_progress=False)
    module = model[0]
    weight = module.weight.detach()
    global_scale = generate_gparam(weight.amin(), weight.amax())
    module.weight_global_scale.data.copy_(global_scale)
    groups = weight.unflatten(-1, (-1, 16))  # [O, G, 16]
    scale, _ = calculate_qparams(
        groups.amin(-1), groups.amax(-1), module.quantization_scheme.weights, global_scale=global_scale
    )
    module.weight_scale.data.copy_(scale)
    module.input_global_scale.data.copy_(generate_gparam(x.amin(), x.amax()))
    return library_pipeline_outputs(model, x)


# ---- codes and packing ------------------------------------------------------------------------------------------


def test_byte_0x97_is_plus_six_and_minus_half():
    # spec F.2: low nibble 0x7 = +6.0 (value 2j), high nibble 0x9 = sign | 1 = -0.5 (value 2j+1)
    assert torch.equal(pack_fp4(torch.tensor([[7, 9]], dtype=torch.uint8)), torch.tensor([[0x97]], dtype=torch.uint8))
    codes = unpack_fp4(torch.tensor([[0x97]], dtype=torch.uint8))
    assert codes.tolist() == [[7, 9]]
    assert torch.equal(e2m1_to_float(codes), torch.tensor([[6.0, -0.5]]))


def test_pack_and_unpack_are_inverse_over_all_bytes():
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    codes = unpack_fp4(every_byte)
    assert codes.shape == (4, 128) and int(codes.max()) == 15
    assert torch.equal(pack_fp4(codes), every_byte)


def test_unpack_matches_compressed_tensors_over_all_bytes():
    every_byte = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    ref = unpack_fp4_from_uint8(every_byte, 4, 128, dtype=torch.float32)
    assert torch.equal(e2m1_to_float(unpack_fp4(every_byte)), ref)


def test_pack_matches_compressed_tensors_for_every_code():
    values = torch.tensor(ALL_CODES_AS_FLOATS * 2).reshape(2, 16)
    codes = torch.arange(16, dtype=torch.uint8).repeat(2, 1)  # code k <-> ALL_CODES_AS_FLOATS[k]
    assert torch.equal(e2m1_to_float(codes), values)
    assert torch.equal(pack_fp4(codes), pack_fp4_to_uint8(values))


def test_float_to_e2m1_rounds_like_compressed_tensors_including_ties_and_signs():
    # midpoints between E2M1 values (ties go to the even mantissa), points just around them, saturation
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    near = [t + d for t in ties for d in (-1e-3, 1e-3)]
    grid = torch.tensor([0.1, 0.3, 0.6, 1.1, 2.2, 2.9, 4.5, 5.5, 6.0, 7.0, 100.0] + ties + near)
    x = torch.cat([torch.zeros(1), grid, -grid, torch.randn(255) * 3])  # 1 + 2*32 + 255 = 320 values
    ref = FP4_E2M1_DATA.cast_to_fp4(x.clone())
    ours = e2m1_to_float(float_to_e2m1(x))
    assert torch.equal(ours, ref)
    # sign bits too: a small negative value rounds to -0.0 and packs as code 0x8, as the library packs it
    assert torch.equal(pack_fp4(float_to_e2m1(x.reshape(1, -1))), pack_fp4_to_uint8(ref.reshape(1, -1)))


def test_negative_zero_input_gets_the_code_the_library_quantizer_writes():
    # The library's quantizer rounds through torch.sign, which maps an input of -0.0 to +0 (code 0x0), while
    # -0.1 keeps its sign (code 0x8); checkpoint bytes come from the quantizer, so we match it.
    x = torch.tensor([[-0.0, -0.1] + [0.0] * 14])
    ref = quantize_and_pack_fp4(x, torch.ones(1, 1), global_scale=torch.ones(1))
    assert ref[0, 0].item() == 0x80
    assert torch.equal(pack_fp4(float_to_e2m1(x)), ref)


def test_float_to_e2m1_hand_values():
    # ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4; 5.1 -> 6; -0.2 -> -0 (code 8)
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, -0.2, -3.0])
    assert float_to_e2m1(x).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 13]


# ---- weights ----------------------------------------------------------------------------------------------------


def test_hand_worked_weight():
    # Row 0 has amax 6, so global = 448*6/6 = 448 and its group scale is fp8(448 * 6/6) = 448: codes are round(W).
    row0 = [6.0, -0.5, 1.25, 0.3, 2.5, 3.5, 5.0, 5.1, -0.2, 0.75, 1.75, -3.0, 4.0, 0.0, -6.0, 1.5]
    # codes:  7,  9,    2,    1,   4,   6,   6,   7,   8,    2,    4,   13,   6,   0,  15,   3
    # bytes (low | high << 4): 0x97 0x12 0x64 0x76 0x28 0xD4 0x06 0x3F
    # Row 1 has amax 3: scale fp8(448 * 3/6) = 224, so the effective scale is 224/448 = 0.5 and codes = round(2W).
    row1 = [3.0, -1.5, 0.2, 0.0] + [0.0] * 12  # 2W = 6, -3, 0.4 -> 0.5; dequantized back: 3, -1.5, 0.25, 0
    weight = torch.tensor([row0, row1])
    packed, scale, global_scale = quantize_nvfp4_weight(weight)
    assert torch.equal(global_scale, torch.tensor([448.0]))
    assert torch.equal(scale.float(), torch.tensor([[448.0], [224.0]]))
    assert packed[0].tolist() == [0x97, 0x12, 0x64, 0x76, 0x28, 0xD4, 0x06, 0x3F]
    assert packed[1, :2].tolist() == [0xD7, 0x01]  # codes (7, 13), (1, 0)
    dense = dequantize_nvfp4_weight(packed, scale, global_scale, torch.float32)
    expected_row0 = [6.0, -0.5, 1.0, 0.5, 2.0, 4.0, 4.0, 6.0, -0.0, 1.0, 2.0, -3.0, 4.0, 0.0, -6.0, 1.5]
    assert dense[0].tolist() == expected_row0
    assert dense[1, :4].tolist() == [3.0, -1.5, 0.25, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_nvfp4_weight_matches_compressed_tensors_checkpoint_tensors(dtype):
    linear = tiny_linear(dtype)
    x = torch.randn(2, 3, 64, dtype=dtype)
    ref = compress_with_compressed_tensors(linear, x)
    packed, scale, global_scale = quantize_nvfp4_weight(linear.weight.detach())
    compressed = ref["compressed"]

    assert ref["format"] == "nvfp4-pack-quantized"
    assert set(compressed) == {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale", "bias"}
    assert (packed.shape, packed.dtype) == ((24, 32), torch.uint8)  # [O, I/2]
    assert (compressed["weight_packed"].shape, compressed["weight_packed"].dtype) == ((24, 32), torch.uint8)
    assert (scale.shape, scale.dtype) == ((24, 4), FP8)  # [O, G]
    assert (compressed["weight_scale"].shape, compressed["weight_scale"].dtype) == ((24, 4), FP8)
    assert global_scale.dtype == compressed["weight_global_scale"].dtype == torch.float32
    assert torch.equal(global_scale, compressed["weight_global_scale"])
    assert torch.equal(scale.view(torch.uint8), compressed["weight_scale"].view(torch.uint8))
    assert torch.equal(packed, compressed["weight_packed"])
    assert torch.equal(nvfp4_global_scale(x), compressed["input_global_scale"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_nvfp4_weight_matches_compressed_tensors_decompression(dtype):
    # spec F.4: the library unpacks through bf16, so its dense weight is bf16 even for an fp32 model. Our bf16
    # result must equal it bit for bit; our fp32 result is the same numbers before that final rounding.
    linear = tiny_linear(dtype)
    ref = compress_with_compressed_tensors(linear, torch.randn(2, 3, 64, dtype=dtype))
    c = ref["compressed"]
    assert ref["decompressed_weight"].dtype == torch.bfloat16
    ours_bf16 = dequantize_nvfp4_weight(c["weight_packed"], c["weight_scale"], c["weight_global_scale"], torch.bfloat16)
    ours_fp32 = dequantize_nvfp4_weight(c["weight_packed"], c["weight_scale"], c["weight_global_scale"], torch.float32)
    assert torch.equal(ours_bf16, ref["decompressed_weight"])
    assert torch.equal(ours_fp32.to(torch.bfloat16), ref["decompressed_weight"])
    # and the round trip stays close to the original weight (4-bit error: under a quarter of each group's max)
    assert (ours_fp32 - linear.weight.float()).abs().max() < 0.25 * linear.weight.float().abs().max()


def test_global_scale_hand_values_and_fallbacks():
    assert torch.equal(nvfp4_global_scale(torch.tensor([1.0, -6.0])), torch.tensor([448.0]))  # 448*6/6
    assert torch.equal(nvfp4_global_scale(torch.zeros(16)), torch.tensor([1.0]))  # 2688/tiny = inf -> 1
    assert torch.equal(nvfp4_global_scale(torch.tensor([1.0, float("nan")])), torch.tensor([1.0]))
    # spec F.4: computed in the weight dtype, e.g. 2688/0.3294 = 8160.3 in fp32 but 8160.0 in bf16
    w = torch.tensor([0.3294], dtype=torch.bfloat16)
    assert torch.equal(nvfp4_global_scale(w), generate_gparam(w.amin(), w.amax()))


def test_group_scales_follow_the_library_rounding_in_bf16():
    # compressed-tensors divides max|group| by 6 in the tensor's dtype before multiplying by the fp32 global scale;
    # in bf16 that rounding changes some FP8 scales, so doing it in fp32 would write different bytes.
    torch.manual_seed(0)
    weight = torch.randn(64, 256, dtype=torch.bfloat16)
    global_scale = nvfp4_global_scale(weight)
    groups = weight.unflatten(-1, (-1, 16))  # [O, G, 16]
    args = preset_name_to_scheme("NVFP4", ["Linear"]).weights
    ref, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=global_scale)
    assert torch.equal(nvfp4_group_scales(weight, global_scale), ref)
    in_fp32 = (global_scale * groups.abs().amax(-1).float() / 6).to(FP8).float()
    assert (in_fp32 != ref).any()


def test_in_features_must_be_a_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4_weight(torch.randn(4, 24))
    with pytest.raises(ValueError, match="multiple of 16"):
        NVFP4Linear(24, 8)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_dequantize_nvfp4_activation(torch.randn(2, 24), torch.tensor([100.0]))


# ---- activations ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 5, 64), (7, 64)])
def test_activation_fake_quant_matches_compressed_tensors(dtype, shape):
    torch.manual_seed(2)
    x = torch.randn(*shape, dtype=dtype) * 4
    ref = compress_with_compressed_tensors(tiny_linear(dtype), x)["input_fake_quant"]
    ours = quantize_dequantize_nvfp4_activation(x, nvfp4_global_scale(x))
    assert ours.dtype == dtype and ours.shape == x.shape
    assert torch.equal(ours, ref)


def test_activation_fake_quant_hand_values():
    # global 448 (amax 6). Group 0: amax 6 -> scale 448 -> effective 1 -> plain E2M1 rounding.
    # Group 1: amax 0.75 -> scale fp8(448 * 0.125) = 56 -> effective 0.125; 0.3/0.125 = 2.4 -> 2 -> 0.25.
    x = torch.tensor([[6.0, 1.2, -2.6] + [0.0] * 13 + [0.75, 0.3] + [0.0] * 14])
    y = quantize_dequantize_nvfp4_activation(x, torch.tensor([448.0]))
    assert y[0, :3].tolist() == [6.0, 1.0, -3.0]
    assert y[0, 16:18].tolist() == [0.75, 0.25]


# ---- module -----------------------------------------------------------------------------------------------------


def test_nvfp4_linear_module_has_checkpoint_names_dtypes_and_no_grad():
    module = NVFP4Linear(64, 24, bias=True)
    shapes = {name: (tuple(p.shape), p.dtype, p.requires_grad) for name, p in module.state_dict(keep_vars=True).items()}
    assert shapes == {
        "weight_packed": ((24, 32), torch.uint8, False),
        "weight_scale": ((24, 4), FP8, False),
        "weight_global_scale": ((1,), torch.float32, False),
        "input_global_scale": ((1,), torch.float32, False),
        "bias": ((24,), torch.bfloat16, False),
    }
    assert set(NVFP4Linear(64, 24, quantize_input=False).state_dict()) == {
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
    }


def test_nvfp4_linear_module_loads_compressed_tensors_tensors_and_matches_library_forward():
    linear = tiny_linear(torch.float32)
    x = torch.randn(2, 5, 64)
    ref = compress_with_compressed_tensors(linear, x)
    module = NVFP4Linear(64, 24, bias=True, dtype=torch.float32)
    module.load_state_dict(ref["compressed"], strict=True)
    with torch.no_grad():
        torch.testing.assert_close(module(x), ref["fake_quant_output"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_linear_module_forward_equals_dense_linear_on_fake_quantized_activation(dtype):
    linear = tiny_linear(dtype)
    x = torch.randn(3, 4, 64, dtype=dtype)
    module = NVFP4Linear.from_linear(linear, input_global_scale=nvfp4_global_scale(x))
    dense = nn.Linear(64, 24, dtype=dtype)
    with torch.no_grad():
        dense.weight.copy_(module.dequantized_weight(dtype))
        dense.bias.copy_(linear.bias)
        expected = dense(quantize_dequantize_nvfp4_activation(x, module.input_global_scale))
        y = module(x)
        unquantized = linear(x)
    assert y.dtype == dtype and y.shape == (3, 4, 24)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol)
    assert (y.float() - unquantized.float()).norm() / unquantized.float().norm() < 0.25  # W4A4 error, not garbage


def test_nvfp4_linear_without_input_global_scale_is_weight_only():
    linear = tiny_linear(torch.float32)
    module = NVFP4Linear.from_linear(linear)
    assert module.input_global_scale is None
    x = torch.randn(2, 64)
    expected = x @ module.dequantized_weight(torch.float32).t() + linear.bias
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-5)
        y = nvfp4_linear(x, module.weight_packed, module.weight_scale, module.weight_global_scale, None, linear.bias)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_nvfp4_linear_module_keeps_format_dtypes_under_to_dtype():
    linear = tiny_linear(torch.float32)
    module = NVFP4Linear.from_linear(linear, input_global_scale=torch.tensor([1234.567]))
    global_before = module.weight_global_scale.detach().clone()
    module.to(torch.bfloat16)
    assert module.weight_scale.dtype == FP8
    assert module.weight_global_scale.dtype == module.input_global_scale.dtype == torch.float32
    assert torch.equal(module.weight_global_scale, global_before)  # not rounded to bf16
    assert torch.equal(module.input_global_scale, torch.tensor([1234.567]))
    assert module.bias.dtype == torch.bfloat16


def test_nvfp4_linear_module_parameter_bytes_are_about_0_28_of_bf16():
    module = NVFP4Linear(256, 256)
    dense = nn.Linear(256, 256, bias=False, dtype=torch.bfloat16)

    def nbytes(m: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    ratio = nbytes(module) / nbytes(dense)  # (256*128 + 256*16 + 4 + 4) / (256*256*2) = 0.2813
    assert 0.275 < ratio < 0.29
