"""FP8 dynamic format (compressed-tensors preset FP8_DYNAMIC, format "float-quantized"): spec F.1.

Weights are stored as float8_e4m3fn with one scale per output channel; activations are quantized per token at
run time. Pure functions do the math; `FP8Linear` holds the checkpoint tensors under their checkpoint names.

Legend: O out_features, I in_features, T tokens, ... any leading dims.
"""

import warnings
from collections.abc import Callable, Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_MIN_CAPABILITY = (8, 9)  # first CUDA architecture with FP8 tensor cores (Ada)

Fp8Kernel = Literal["auto", "scaled_mm", "dequant"]


# ---- pure functions ---------------------------------------------------------------------------------------------


def _nonzero_scale(scale: torch.Tensor) -> torch.Tensor:
    """Replace zero scales by the dtype's eps, as compressed-tensors does, so an all-zero row divides safely."""
    eps = torch.finfo(scale.dtype).eps
    return torch.where(scale == 0, torch.full_like(scale, eps), scale)


def _cast_fp8(scaled: torch.Tensor) -> torch.Tensor:
    """Clamp to the e4m3 range and round to float8_e4m3fn (round to nearest even)."""
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_fp8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight per output channel, symmetric, as the FP8_DYNAMIC preset does (spec F.1).

    The division happens in the weight's dtype, like compressed-tensors, so a bf16 weight gives the same bytes as a
    checkpoint written from a bf16 model.

    Args:
        weight: `[O, I]` floating-point weight.

    Returns:
        `(qweight, weight_scale)`: `qweight` `[O, I]` float8_e4m3fn and `weight_scale` `[O, 1]` in the weight's
        dtype, with `weight ≈ float(qweight) * weight_scale`.
    """
    amax = weight.abs().amax(dim=-1, keepdim=True)  # [O, 1]
    weight_scale = _nonzero_scale(amax / FP8_MAX)  # [O, 1] weight dtype; spec F.1: max|W_r| / 448
    qweight = _cast_fp8(weight / weight_scale)  # [O, I] fp8
    return qweight, weight_scale


def dequantize_fp8_weight(
    qweight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Dense weight from an FP8 weight and its per-channel scale (spec F.1).

    Args:
        qweight: `[O, I]` float8_e4m3fn.
        weight_scale: `[O, 1]` scale (any float dtype).
        dtype: dtype of the result; the product is computed in it.

    Returns:
        `[O, I]` weight `float(qweight) * weight_scale` in `dtype`.
    """
    return qweight.to(dtype) * weight_scale.to(dtype)  # [O, I]


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token activation quantization (spec F.1).

    Every token (every vector along the last dim) gets its own scale, whatever the number of leading dims. This
    differs on purpose from compressed-tensors' helper, which uses one scale for a whole 2-D input (spec F.4).

    Args:
        x: `[..., I]` activations.

    Returns:
        `(xq, scale)`: `xq` `[..., I]` float8_e4m3fn and `scale` `[..., 1]` in `x`'s dtype, `x ≈ float(xq) * scale`.
    """
    amax = x.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    scale = _nonzero_scale(amax / FP8_MAX)  # [..., 1]; spec F.1: s_t = max|x_t| / 448
    return _cast_fp8(x / scale), scale


def native_fp8_available(device: torch.device | str) -> bool:
    """Whether `device` is a CUDA GPU with FP8 tensor cores (compute capability >= 8.9).

    Args:
        device: any torch device.

    Returns:
        True for CUDA devices of capability >= 8.9, False otherwise (CPU, older GPUs, other backends).
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY


def check_fp8_supported(device: torch.device | str, argument: str = "kernel") -> None:
    """Raise if native FP8 matmuls (`torch._scaled_mm`) cannot run on `device`.

    Use it when a user explicitly asks for the native kernel; the default path needs no check because it falls
    back to dequantization.

    Args:
        device: the device the matmul would run on.
        argument: the caller's name for the kernel choice, named in the message (`FP8Linear(kernel=...)`,
            `from_pretrained(fp8_kernel=...)`).

    Raises:
        RuntimeError: naming the device found, what is supported and what to do instead.
    """
    device = torch.device(device)
    fix = (
        f"Use {argument}='auto' or {argument}='dequant' (dequantizes the FP8 weights per call; works on any device), "
        "or run on an Ada (L4, L40, RTX 40xx), Hopper (H100, H200) or Blackwell GPU."
    )
    need = "it needs a CUDA GPU with FP8 tensor cores (compute capability >= {}.{})".format(*FP8_MIN_CAPABILITY)
    if device.type != "cuda":
        raise RuntimeError(
            f"Native FP8 matmul (torch._scaled_mm) was requested on device '{device}', but {need}. {fix}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"Native FP8 matmul was requested on '{device}', but CUDA is not available here; {need}. {fix}"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"Native FP8 matmul was requested on '{device}' ({name}, compute capability {major}.{minor}), but {need}. "
            f"{fix}"
        )


def fp8_linear_dequant(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Portable FP8 linear: quantize `x` per token, dequantize both operands, matmul in `x`'s dtype.

    Args:
        x: `[..., I]` activations.
        qweight: `[O, I]` float8_e4m3fn.
        weight_scale: `[O, 1]` per-channel scale.
        bias: optional `[O]`.

    Returns:
        `[..., O]` in `x`'s dtype, equal to `F.linear(dequant(x_q), dequant(W_q), bias)`.
    """
    xq, x_scale = quantize_fp8_per_token(x)  # [..., I] fp8, [..., 1]
    x_dq = xq.to(x.dtype) * x_scale  # [..., I]
    w_dq = dequantize_fp8_weight(qweight, weight_scale, x.dtype)  # [O, I]
    return F.linear(x_dq, w_dq, None if bias is None else bias.to(x.dtype))  # [..., O]


def fp8_linear_scaled_mm(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Native FP8 linear with `torch._scaled_mm`: `y = (x_q @ W_qᵀ) · s_x · s_wᵀ` (spec F.1), fp32 accumulation.

    No device check here: callers decide (see `fp8_linear`, `check_fp8_supported`). CUDA needs `I` and `O` to be
    multiples of 16 and, for row-wise scales, a bf16 output.

    Args:
        x: `[..., I]` activations.
        qweight: `[O, I]` float8_e4m3fn.
        weight_scale: `[O, 1]` per-channel scale.
        bias: optional `[O]`.

    Returns:
        `[..., O]` in `x`'s dtype.
    """
    xq, x_scale = quantize_fp8_per_token(x.reshape(-1, x.shape[-1]))  # [T, I] fp8, [T, 1]
    y = torch._scaled_mm(
        xq,
        qweight.t(),  # [I, O] column-major view, as _scaled_mm wants
        scale_a=x_scale.float(),  # [T, 1]
        scale_b=weight_scale.float().reshape(1, -1).contiguous(),  # [1, O]
        out_dtype=x.dtype,
    )  # [T, O]
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*x.shape[:-1], qweight.shape[0])  # [..., O]


def _scaled_mm_fits(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Whether the auto path should try `torch._scaled_mm` for these operands."""
    out_features, in_features = qweight.shape
    return (
        native_fp8_available(x.device)
        and x.dtype == torch.bfloat16
        and in_features % 16 == 0
        and out_features % 16 == 0
        and x.numel() > 0
    )


def fp8_linear(
    x: torch.Tensor, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """FP8 linear that picks the native kernel when it can and dequantization otherwise.

    `torch._scaled_mm` is used for bf16 activations on CUDA devices of capability >= 8.9 with `I`, `O` multiples
    of 16; if it raises, the call falls back to `fp8_linear_dequant` with a warning. Everywhere else (CPU, older
    GPUs) both operands are dequantized and multiplied in `x`'s dtype.

    Args:
        x: `[..., I]` activations.
        qweight: `[O, I]` float8_e4m3fn.
        weight_scale: `[O, 1]` per-channel scale.
        bias: optional `[O]`.

    Returns:
        `[..., O]` in `x`'s dtype.
    """
    if _scaled_mm_fits(x, qweight):
        try:
            return fp8_linear_scaled_mm(x, qweight, weight_scale, bias)
        except RuntimeError as err:
            warnings.warn(f"torch._scaled_mm failed ({err}); using the dequantizing FP8 path instead.", stacklevel=2)
    return fp8_linear_dequant(x, qweight, weight_scale, bias)


# ---- module -----------------------------------------------------------------------------------------------------


def dtype_preserving_fn(
    fn: Callable[[torch.Tensor], torch.Tensor], fixed: Iterable[torch.Tensor | None]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Wrap an `nn.Module._apply` function so the `fixed` tensors may change device but never dtype.

    The stored dtypes are part of the format (spec F): `model.to(torch.bfloat16)` must not upcast an FP8 weight or
    round an fp32 global scale to bf16. A fixed tensor whose dtype `fn` would change is only moved to `fn`'s device.

    Args:
        fn: the function `nn.Module._apply` received.
        fixed: tensors whose dtype must stay (None entries are skipped).

    Returns:
        The function to pass on to `nn.Module._apply`.
    """
    fixed_ids = {id(t) for t in fixed if t is not None}

    def move_only(t: torch.Tensor) -> torch.Tensor:
        out = fn(t)
        if id(t) in fixed_ids and out.dtype != t.dtype:
            return t.detach().to(device=out.device)
        return out

    return move_only


class FP8Linear(nn.Module):
    """Linear layer holding a compressed-tensors FP8-dynamic weight (spec F.1).

    State-dict keys match the checkpoint: `weight` float8_e4m3fn `[O, I]`, `weight_scale` `[O, 1]` in the model
    dtype, optional `bias` `[O]`. Activations are quantized per token at run time. `weight` keeps its FP8 dtype
    under `module.to(dtype)`.

    Args:
        in_features: I.
        out_features: O.
        bias: whether to hold a bias.
        dtype: model dtype (of `weight_scale` and `bias`).
        device: where to allocate.
        kernel: "auto" (native `torch._scaled_mm` on GPUs with FP8 tensor cores, else dequantization), "scaled_mm"
            (native only; raises on unsupported hardware, see `check_fp8_supported`) or "dequant" (always
            dequantize).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        kernel: Fp8Kernel = "auto",
    ) -> None:
        super().__init__()
        if kernel not in ("auto", "scaled_mm", "dequant"):
            raise ValueError(f"kernel must be 'auto', 'scaled_mm' or 'dequant', got {kernel!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.kernel = kernel
        self.weight = nn.Parameter(
            torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device), requires_grad=False
        )  # [O, I] fp8
        self.weight_scale = nn.Parameter(
            torch.ones(out_features, 1, dtype=dtype, device=device), requires_grad=False
        )  # [O, 1]
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: Fp8Kernel = "auto") -> "FP8Linear":
        """Quantize an existing `nn.Linear` (per-channel weight scales in its dtype).

        Args:
            linear: the dense layer; left unchanged.
            kernel: see the class docstring.

        Returns:
            A new `FP8Linear` on `linear`'s device.
        """
        weight = linear.weight.detach()
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            dtype=weight.dtype,
            device=weight.device,
            kernel=kernel,
        )
        qweight, weight_scale = quantize_fp8_weight(weight)
        module.weight.data.copy_(qweight)
        module.weight_scale.data.copy_(weight_scale)
        if linear.bias is not None:
            module.bias.data.copy_(linear.bias.detach())
        return module

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Dense `[O, I]` weight in `dtype` (default: the dtype of `weight_scale`)."""
        return dequantize_fp8_weight(self.weight, self.weight_scale, dtype or self.weight_scale.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`[..., I]` -> `[..., O]` in `x`'s dtype."""
        if self.kernel == "scaled_mm":
            check_fp8_supported(x.device)
            if x.dtype != torch.bfloat16:  # newer torch accepts some other output dtypes; keep one contract
                raise ValueError(f"FP8Linear(kernel='scaled_mm') needs bf16 activations, got {x.dtype}; cast the model "
                                 "to torch.bfloat16, or use kernel='auto' (dequantizes other dtypes) or 'dequant'")
            return fp8_linear_scaled_mm(x, self.weight, self.weight_scale, self.bias)
        if self.kernel == "dequant":
            return fp8_linear_dequant(x, self.weight, self.weight_scale, self.bias)
        return fp8_linear(x, self.weight, self.weight_scale, self.bias)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - signature of nn.Module._apply
        return super()._apply(dtype_preserving_fn(fn, [self.weight]), recurse)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, kernel={self.kernel!r}"
        )
