"""FP8 and NVFP4 layers on CUDA (quantization/fp8.py, nvfp4.py): the native `torch._scaled_mm` kernel on GPUs with FP8
tensor cores (sm89+), which needs bf16 activations, and NVFP4's dequantizing path on the GPU."""

import pytest
import torch
from torch import nn

from diffusiongemma.quantization import fp8 as fp8_module
from diffusiongemma.quantization.fp8 import (
    FP8Linear,
    dequantize_fp8_weight,
    fp8_linear_dequant,
    native_fp8_available,
    quantize_fp8_per_token,
)
from diffusiongemma.quantization.nvfp4 import NVFP4Linear

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_fp8 = pytest.mark.skipif(not torch.cuda.is_available() or not native_fp8_available("cuda"),
                               reason="needs FP8 tensor cores (sm89+)")


def layer(dtype=torch.bfloat16, kernel="scaled_mm", bias=True) -> FP8Linear:
    torch.manual_seed(0)
    return FP8Linear.from_linear(nn.Linear(256, 96, bias=bias).to("cuda", dtype), kernel=kernel)


def quantized_reference(x: torch.Tensor, module: FP8Linear) -> torch.Tensor:
    """(x_q s_x)(W_q s_w)^T + b in fp32: what the kernel computes before rounding its output to bf16."""
    xq, sx = quantize_fp8_per_token(x)
    w = dequantize_fp8_weight(module.weight, module.weight_scale, torch.float32)
    return (xq.float() * sx.float()) @ w.T + module.bias.float()


@needs_fp8
@torch.no_grad()
def test_scaled_mm_matches_the_quantized_product():
    module = layer()
    x = torch.randn(3, 17, 256, device="cuda", dtype=torch.bfloat16)  # 3-D, a token count that is not a multiple of 16
    got = module(x)
    assert got.shape == (3, 17, 96) and got.dtype == torch.bfloat16
    want = quantized_reference(x, module)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)  # bf16 output rounding
    torch.testing.assert_close(got, fp8_linear_dequant(x, module.weight, module.weight_scale, module.bias),
                               atol=5e-2, rtol=5e-2)  # the portable path rounds its dequantized operands to bf16


@needs_fp8
@torch.no_grad()
def test_auto_kernel_takes_scaled_mm_for_bf16_and_dequantizes_fp32(monkeypatch):
    calls = []
    native = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(1) or native(*a, **k))
    bf16 = layer(kernel="auto")
    bf16(torch.randn(5, 256, device="cuda", dtype=torch.bfloat16))
    assert calls == [1]
    fp32 = layer(torch.float32, kernel="auto")
    x = torch.randn(5, 256, device="cuda")
    assert torch.equal(fp32(x), fp8_linear_dequant(x, fp32.weight, fp32.weight_scale, fp32.bias))
    assert calls == [1]  # fp32 activations never reach the native kernel


@needs_fp8
@torch.no_grad()
def test_scaled_mm_kernel_refuses_activations_other_than_bf16():
    module = layer(torch.float32)
    for dtype in (torch.float32, torch.float16):
        with pytest.raises((RuntimeError, ValueError), match="(?i)bf16|bfloat16"):
            module(torch.randn(4, 256, device="cuda", dtype=dtype))


@needs_fp8
def test_scaled_mm_fallback_is_not_taken_for_supported_shapes(recwarn):
    with torch.no_grad():
        layer(kernel="auto")(torch.randn(64, 256, device="cuda", dtype=torch.bfloat16))
    assert not [w for w in recwarn if "scaled_mm failed" in str(w.message)]
    assert fp8_module.native_fp8_available(torch.device("cuda"))


@torch.no_grad()
def test_nvfp4_linear_on_cuda_matches_cpu():
    """No native FP4 kernel (Blackwell only): the GPU runs the same dequantizing math as the CPU."""
    torch.manual_seed(0)
    dense = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    cpu = NVFP4Linear.from_linear(dense)
    gpu = NVFP4Linear.from_linear(dense.to("cuda"))
    for name, t in cpu.state_dict().items():
        assert torch.equal(gpu.state_dict()[name].cpu(), t), name  # quantized on the GPU to the same bytes
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), atol=2e-2, rtol=2e-2)
