"""Tests for diffusiongemma/quantization/fp8.py, checked against compressed-tensors itself (spec F.1).

Legend: O out_features, I in_features, T tokens.
"""

import copy

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
from compressed_tensors.quantization.utils import calculate_qparams
from torch import nn

from ct_checkpoint import library_pipeline_outputs

from diffusiongemma.quantization import fp8
from diffusiongemma.quantization.fp8 import (
    FP8Linear,
    check_fp8_supported,
    dequantize_fp8_weight,
    fp8_linear,
    fp8_linear_dequant,
    fp8_linear_scaled_mm,
    quantize_fp8_per_token,
    quantize_fp8_weight,
)

FP8 = torch.float8_e4m3fn


def tiny_linear(dtype: torch.dtype, bias: bool = True, in_features: int = 64, out_features: int = 32) -> nn.Linear:
    """Random Linear with an all-zero row (scale edge case) and one large outlier."""
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    with torch.no_grad():
        linear.weight[3].zero_()
        linear.weight[5, 7] = 3.0
    return linear


def compress_with_compressed_tensors(linear: nn.Linear, x: torch.Tensor) -> dict:
    """Run compressed-tensors' own FP8_DYNAMIC pipeline on a copy of `linear`.

    apply_quantization_config attaches the preset; compressed-tensors has no observers (LLM Compressor does), so
    the weight scale is calibrated with the library's `calculate_qparams` on per-row min/max. Then the library's
    fake-quant forward runs on `x`, `ModelCompressor` compresses (the tensors a checkpoint holds) and decompresses.
    """
    model = nn.Sequential(copy.deepcopy(linear))
    apply_quantization_config(model, QuantizationConfig(config_groups={"FP8_DYNAMIC": ["Linear"]}), show_progress=False)
    module = model[0]
    weight = module.weight.detach()
    scale, _ = calculate_qparams(
        weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), module.quantization_scheme.weights
    )
    module.weight_scale.data.copy_(scale)
    return library_pipeline_outputs(model, x)


# ---- pure functions against compressed-tensors ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_fp8_weight_matches_compressed_tensors_checkpoint_tensors(dtype):
    linear = tiny_linear(dtype)
    ref = compress_with_compressed_tensors(linear, torch.randn(2, 3, 64, dtype=dtype))
    qweight, weight_scale = quantize_fp8_weight(linear.weight.detach())

    assert ref["format"] == "float-quantized"
    assert set(ref["compressed"]) == {"weight", "weight_scale", "bias"}
    assert ref["compressed"]["weight"].dtype == qweight.dtype == FP8
    assert ref["compressed"]["weight_scale"].dtype == weight_scale.dtype == dtype  # spec F.1: model dtype
    assert qweight.shape == (32, 64) and weight_scale.shape == (32, 1)
    assert torch.equal(qweight.view(torch.uint8), ref["compressed"]["weight"].view(torch.uint8))
    assert torch.equal(weight_scale, ref["compressed"]["weight_scale"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_fp8_weight_matches_compressed_tensors_decompression(dtype):
    linear = tiny_linear(dtype)
    ref = compress_with_compressed_tensors(linear, torch.randn(2, 3, 64, dtype=dtype))
    dense = dequantize_fp8_weight(ref["compressed"]["weight"], ref["compressed"]["weight_scale"], dtype)
    assert dense.dtype == dtype
    assert torch.equal(dense, ref["decompressed_weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_activation_matches_compressed_tensors_on_3d_input(dtype):
    x = torch.randn(2, 5, 64, dtype=dtype) * torch.linspace(0.1, 10, 5, dtype=dtype)[None, :, None]
    ref = compress_with_compressed_tensors(tiny_linear(dtype), x)["input_fake_quant"]
    xq, scale = quantize_fp8_per_token(x)  # [2, 5, 64] fp8, [2, 5, 1]
    assert xq.dtype == FP8 and scale.shape == (2, 5, 1) and scale.dtype == dtype
    assert torch.equal(xq.to(dtype) * scale, ref)


def test_per_token_activation_is_per_token_for_2d_input_unlike_the_library_helper():
    # spec F.4: the library's helper uses one scale for a 2-D input; ours keeps one scale per token.
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25], [100.0, 3.0, -50.0, 1.0]])  # [T=2, I=4]
    xq, scale = quantize_fp8_per_token(x)
    assert torch.equal(scale.flatten(), torch.tensor([2.0, 100.0]) / 448)
    ref_3d = compress_with_compressed_tensors(nn.Linear(4, 16), x[None])["input_fake_quant"][0]
    ref_2d = compress_with_compressed_tensors(nn.Linear(4, 16), x)["input_fake_quant"]
    assert torch.equal(xq.float() * scale, ref_3d)
    assert not torch.equal(ref_2d, ref_3d)  # per-tensor: the small token loses precision


# ---- hand-worked numbers ----------------------------------------------------------------------------------------


def test_hand_worked_weight_activation_and_matmul():
    # Row 0: amax 7 -> scale 7/448 = 2^-6. W/scale = [448, -64, 19.2]; 19.2 lies between e4m3 values 18 and 20
    #        (step 2 in [16, 32)) and rounds to 20, so it dequantizes to 20 * 2^-6 = 0.3125.
    # Row 1: all zero -> scale 0 is replaced by fp32 eps, codes stay 0.
    weight = torch.tensor([[7.0, -1.0, 0.3], [0.0, 0.0, 0.0]])
    qweight, weight_scale = quantize_fp8_weight(weight)
    assert torch.equal(qweight.float(), torch.tensor([[448.0, -64.0, 20.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(weight_scale, torch.tensor([[2.0**-6], [torch.finfo(torch.float32).eps]]))
    dense = dequantize_fp8_weight(qweight, weight_scale, torch.float32)
    assert torch.equal(dense[0], torch.tensor([7.0, -1.0, 0.3125]))

    # Token 0: amax 3.5 -> s = 2^-7; x/s = [448, -32, 12.8]; 12.8 rounds to 13 (step 1 in [8, 16)) -> 0.1015625.
    # Token 1: amax 1.75 -> s = 2^-8; x/s = [0, 0, 448].
    x = torch.tensor([[3.5, -0.25, 0.1], [0.0, 0.0, 1.75]])
    xq, x_scale = quantize_fp8_per_token(x)
    assert torch.equal(xq.float(), torch.tensor([[448.0, -32.0, 13.0], [0.0, 0.0, 448.0]]))
    assert torch.equal(x_scale, torch.tensor([[2.0**-7], [2.0**-8]]))

    # y = (x_q @ W_qᵀ) * s_x * s_wᵀ. Token 0, row 0: 3.5*7 + (-0.25)(-1) + 0.1015625*0.3125 = 24.78173828125.
    # Token 1, row 0: 1.75 * 0.3125 = 0.546875. Row 1 is zero.
    y = fp8_linear(x, qweight, weight_scale)
    assert torch.allclose(y, torch.tensor([[24.78173828125, 0.0], [0.546875, 0.0]]), rtol=0, atol=1e-6)


# ---- linear paths -----------------------------------------------------------------------------------------------


def test_fp8_linear_dequant_equals_dense_linear_on_quantized_activation():
    linear = tiny_linear(torch.float32)
    x = torch.randn(2, 7, 64)
    qweight, weight_scale = quantize_fp8_weight(linear.weight.detach())
    xq, x_scale = quantize_fp8_per_token(x)
    dense = nn.Linear(64, 32)
    with torch.no_grad():
        dense.weight.copy_(dequantize_fp8_weight(qweight, weight_scale, torch.float32))
        dense.bias.copy_(linear.bias)
        expected = dense(xq.float() * x_scale)
    y = fp8_linear_dequant(x, qweight, weight_scale, linear.bias)
    assert y.shape == (2, 7, 32)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    # and the quantization error stays small against the unquantized layer
    with torch.no_grad():
        assert (y - linear(x)).norm() / linear(x).norm() < 0.05


def test_scaled_mm_path_matches_the_spec_formula():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    qweight, weight_scale = quantize_fp8_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    bias = torch.randn(32, dtype=torch.bfloat16)
    try:
        y = fp8_linear_scaled_mm(x, qweight, weight_scale, bias)
    except (RuntimeError, NotImplementedError) as err:
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {err}")
    # spec F.1: y = (x_q @ W_qᵀ) · s_x · s_wᵀ (+ bias), evaluated in float64 from the same quantized operands
    xq, x_scale = quantize_fp8_per_token(x)  # [3, 5, 64], [3, 5, 1]
    expected = (xq.double() @ qweight.double().t()) * x_scale.double() * weight_scale.double().t() + bias.double()
    assert y.shape == (3, 5, 32) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), expected, rtol=8e-3, atol=2e-2)  # bf16 output and bias-add rounding


def test_auto_path_dequantizes_on_cpu(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the native kernel must not be used on CPU")

    monkeypatch.setattr(fp8, "fp8_linear_scaled_mm", fail)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    qweight, weight_scale = quantize_fp8_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    assert torch.equal(fp8_linear(x, qweight, weight_scale), fp8_linear_dequant(x, qweight, weight_scale))


def test_auto_path_falls_back_with_a_warning_when_the_native_kernel_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image")

    monkeypatch.setattr(fp8, "native_fp8_available", lambda device: True)
    monkeypatch.setattr(fp8, "fp8_linear_scaled_mm", broken)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    qweight, weight_scale = quantize_fp8_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    with pytest.warns(UserWarning, match="no kernel image"):
        y = fp8_linear(x, qweight, weight_scale)
    assert torch.equal(y, fp8_linear_dequant(x, qweight, weight_scale))


# ---- hardware check ---------------------------------------------------------------------------------------------


def test_check_fp8_supported_explains_cpu():
    with pytest.raises(RuntimeError, match=r"requested on device 'cpu'.*8\.9.*kernel='dequant'"):
        check_fp8_supported("cpu")


def test_check_fp8_supported_explains_old_gpu_and_accepts_hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(RuntimeError, match=r"A100.*capability 8\.0.*>= 8\.9"):
        check_fp8_supported("cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8_supported("cuda:0")  # H100/H200: no error


def test_fp8_linear_module_with_scaled_mm_kernel_refuses_cpu():
    module = FP8Linear.from_linear(tiny_linear(torch.bfloat16), kernel="scaled_mm")
    with pytest.raises(RuntimeError, match="FP8 tensor cores"):
        module(torch.randn(2, 64, dtype=torch.bfloat16))


def test_fp8_linear_module_rejects_unknown_kernel():
    with pytest.raises(ValueError, match="kernel"):
        FP8Linear(64, 32, kernel="cutlass")


# ---- module -----------------------------------------------------------------------------------------------------


def test_fp8_linear_module_has_checkpoint_names_dtypes_and_no_grad():
    module = FP8Linear(64, 32, bias=True, dtype=torch.bfloat16)
    shapes = {name: (tuple(p.shape), p.dtype, p.requires_grad) for name, p in module.state_dict(keep_vars=True).items()}
    assert shapes == {
        "weight": ((32, 64), FP8, False),
        "weight_scale": ((32, 1), torch.bfloat16, False),
        "bias": ((32,), torch.bfloat16, False),
    }
    assert "bias" not in FP8Linear(64, 32).state_dict()


def test_fp8_linear_module_loads_compressed_tensors_tensors_and_matches_library_forward():
    # the library's fake-quant forward (fp32, 3-D input, so genuinely per token) is what a checkpoint means
    linear = tiny_linear(torch.float32)
    x = torch.randn(2, 5, 64)
    ref = compress_with_compressed_tensors(linear, x)
    module = FP8Linear(64, 32, bias=True, dtype=torch.float32, kernel="dequant")
    module.load_state_dict(ref["compressed"], strict=True)
    with torch.no_grad():
        torch.testing.assert_close(module(x), ref["fake_quant_output"], rtol=1e-5, atol=1e-5)


def test_fp8_linear_module_forward_equals_dense_linear_with_dequantized_weight():
    linear = tiny_linear(torch.bfloat16)
    module = FP8Linear.from_linear(linear)
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    xq, x_scale = quantize_fp8_per_token(x)
    dense = nn.Linear(64, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        dense.weight.copy_(module.dequantized_weight())
        dense.bias.copy_(linear.bias)
        expected = dense(xq.to(torch.bfloat16) * x_scale)
        y = module(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 4, 32)
    torch.testing.assert_close(y, expected, rtol=1e-2, atol=1e-2)


def test_fp8_linear_module_keeps_fp8_weight_under_to_dtype():
    module = FP8Linear.from_linear(tiny_linear(torch.bfloat16))
    before = module.weight.detach().view(torch.uint8).clone()
    module.to(torch.float32)
    assert module.weight.dtype == FP8 and torch.equal(module.weight.detach().view(torch.uint8), before)
    assert module.weight_scale.dtype == torch.float32 and module.bias.dtype == torch.float32
    module.half()
    assert module.weight.dtype == FP8 and module.weight_scale.dtype == torch.float16


def test_fp8_linear_module_parameter_bytes_are_half_of_bf16():
    module = FP8Linear(256, 256, dtype=torch.bfloat16)
    dense = nn.Linear(256, 256, bias=False, dtype=torch.bfloat16)

    def nbytes(m: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    ratio = nbytes(module) / nbytes(dense)  # (256*256*1 + 256*2) / (256*256*2) = 0.5039
    assert 0.49 < ratio < 0.51
