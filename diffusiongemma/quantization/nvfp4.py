"""NVFP4 format (compressed-tensors preset NVFP4, format "nvfp4-pack-quantized"): spec F.2.

Weights are FP4 E2M1 codes packed two per byte, with one FP8 E4M3 scale per group of 16 inputs and one fp32
global scale per tensor. Activations are fake-quantized the same way: a static global scale from calibration and
per-group scales computed at run time (`dynamic: "local"`).

Native FP4 matmuls need Blackwell GPUs (compute capability 10.x/12.x); this package does not use them, so NVFP4
always runs as per-call weight dequantization. The weight stays packed in memory (~0.28x of bf16).

Rounding and operation order follow compressed-tensors 0.20.1 so that our bytes equal the library's: scales are
`scale / global` first, then `x / that`; magnitudes round to the nearest E2M1 value with ties to even.

Legend: O out_features, I in_features, G = I/16 groups, ... any leading dims.
"""

import torch
import torch.nn.functional as F
from torch import nn

from diffusiongemma.quantization.fp8 import FP8_DTYPE, FP8_MAX, dtype_preserving_fn

GROUP_SIZE = 16
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of nibble code 0..7; bit 0x8 is the sign
E2M1_SIGN = 0x8
FP8_SCALE_EPS = 0.125  # compressed-tensors' stand-in for a zero FP8 scale

# Rounding boundaries between consecutive E2M1 magnitudes. At an exact midpoint compressed-tensors rounds to the
# value with an even mantissa: `>` where the lower neighbour wins the tie, `>=` where the upper one does.
_STRICT_BOUNDARIES = (0.25, 1.25, 2.5, 5.0)  # ties go down: 0.25->0, 1.25->1, 2.5->2, 5->4
_INCLUSIVE_BOUNDARIES = (0.75, 1.75, 3.5)  # ties go up: 0.75->1, 1.75->2, 3.5->4


# ---- FP4 codes --------------------------------------------------------------------------------------------------


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value and return its 4-bit code (sign bit 0x8 | magnitude index 0..7).

    Magnitudes beyond 6 saturate to 6. A negative input that rounds to zero keeps its sign (code 0x8, -0.0), as
    compressed-tensors does; -0.0 itself gives code 0.

    Args:
        x: any float tensor (already divided by its scales).

    Returns:
        uint8 tensor of codes, same shape as `x`.
    """
    mag = x.abs()
    index = torch.zeros_like(mag, dtype=torch.uint8)
    for boundary in _STRICT_BOUNDARIES:
        index += (mag > boundary).to(torch.uint8)
    for boundary in _INCLUSIVE_BOUNDARIES:
        index += (mag >= boundary).to(torch.uint8)
    return index | ((x < 0).to(torch.uint8) * E2M1_SIGN)


def e2m1_to_float(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Value of each 4-bit E2M1 code (spec F.2: `[0, .5, 1, 1.5, 2, 3, 4, 6]`, bit 0x8 = sign).

    Args:
        codes: integer tensor with values 0..15.
        dtype: dtype of the result (every E2M1 value is exact in bf16, fp16 and fp32).

    Returns:
        Tensor of the same shape as `codes`.
    """
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    codes = codes.long()
    magnitude = table[codes & 0x7]
    return torch.where((codes & E2M1_SIGN) != 0, -magnitude, magnitude)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte: value 2j in the low nibble, 2j+1 in the high nibble (spec F.2).

    Args:
        codes: `[rows, cols]` uint8 codes 0..15, `cols` even.

    Returns:
        `[rows, cols/2]` uint8; e.g. codes (7, 9) = (+6.0, -0.5) pack to 0x97.
    """
    rows, cols = codes.shape
    if cols % 2:
        raise ValueError(f"pack_fp4 needs an even number of columns, got shape {tuple(codes.shape)}")
    pairs = codes.to(torch.uint8).reshape(rows, cols // 2, 2)  # [rows, cols/2, 2]
    return (pairs[..., 0] & 0x0F) | ((pairs[..., 1] & 0x0F) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_fp4`.

    Args:
        packed: `[rows, cols/2]` uint8.

    Returns:
        `[rows, cols]` uint8 codes 0..15.
    """
    low = packed & 0x0F  # value 2j
    high = packed >> 4  # value 2j+1
    return torch.stack((low, high), dim=-1).flatten(-2)  # [rows, cols]


# ---- scales -----------------------------------------------------------------------------------------------------


def _check_groups(x: torch.Tensor, what: str) -> None:
    if x.shape[-1] % GROUP_SIZE:
        raise ValueError(
            f"NVFP4 needs the last dim of {what} to be a multiple of {GROUP_SIZE} (one FP8 scale per {GROUP_SIZE} "
            f"inputs), got shape {tuple(x.shape)}; keep such layers unquantized (list them in `ignore`)."
        )


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor global scale `448 · 6 / max|x|` (spec F.2), for weights or calibration activations.

    Computed in `x`'s dtype like compressed-tensors' `generate_gparam` (a bf16 weight gives a bf16-rounded value,
    spec F.4); NaN or Inf (e.g. an all-zero tensor) becomes 1.

    Args:
        x: any float tensor.

    Returns:
        `[1]` fp32.
    """
    amax = x.abs().amax().clamp(min=torch.finfo(x.dtype).tiny)
    scale = (FP8_MAX * FP4_MAX) / amax
    return torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0).float().reshape(1)


def nvfp4_group_scales(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """FP8 scale of each group of 16: `fp8(global · max|group| / 6)` (spec F.2), zero replaced by 0.125.

    `max|group| / 6` is computed in `x`'s dtype, then multiplied by the fp32 global scale, as compressed-tensors
    does.

    Args:
        x: `[..., I]` weight or activations, `I` a multiple of 16.
        global_scale: `[1]` fp32.

    Returns:
        `[..., G]` fp32 holding values exactly representable in float8_e4m3fn.
    """
    _check_groups(x, "the tensor")
    amax = x.unflatten(-1, (-1, GROUP_SIZE)).abs().amax(dim=-1)  # [..., G] x dtype
    scale = global_scale.float() * (amax / FP4_MAX)  # [..., G] fp32
    scale = scale.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float()  # round to e4m3
    return torch.where(scale == 0, torch.full_like(scale, FP8_SCALE_EPS), scale)


def _round_groups_to_e2m1(x: torch.Tensor, effective_scale: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of `x / effective_scale`, groupwise. `x` `[..., I]`, `effective_scale` `[..., G]` -> `[..., I]`."""
    grouped = x.unflatten(-1, (-1, GROUP_SIZE))  # [..., G, 16]
    scaled = grouped / effective_scale.unsqueeze(-1)  # [..., G, 16] fp32
    return float_to_e2m1(scaled).flatten(-2)  # [..., I]; float_to_e2m1 saturates at ±6


# ---- weights ----------------------------------------------------------------------------------------------------


def quantize_nvfp4_weight(
    weight: torch.Tensor, global_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize a weight to NVFP4 (spec F.2).

    Args:
        weight: `[O, I]`, `I` a multiple of 16.
        global_scale: `[1]` fp32 to use instead of `nvfp4_global_scale(weight)`, e.g. one shared by fused
            partners such as gate/up (spec F.4).

    Returns:
        `(weight_packed, weight_scale, weight_global_scale)`: `[O, I/2]` uint8, `[O, G]` float8_e4m3fn, `[1]` fp32.
    """
    _check_groups(weight, "the weight")
    if global_scale is None:
        global_scale = nvfp4_global_scale(weight)
    global_scale = global_scale.float().reshape(1).to(weight.device)
    scale = nvfp4_group_scales(weight, global_scale)  # [O, G] fp32, e4m3 values
    codes = _round_groups_to_e2m1(weight, scale / global_scale)  # [O, I] uint8
    return pack_fp4(codes), scale.to(FP8_DTYPE), global_scale


def dequantize_nvfp4_weight(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_global_scale: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Dense weight `W[r, c] = e2m1(nibble) · float(weight_scale[r, c // 16]) / weight_global_scale` (spec F.2).

    Computed in fp32 as `e2m1 · (scale / global)` (compressed-tensors' order), then cast once to `dtype`.

    Args:
        weight_packed: `[O, I/2]` uint8.
        weight_scale: `[O, G]` float8_e4m3fn (or any float dtype holding the same values).
        weight_global_scale: `[1]`.
        dtype: dtype of the result.

    Returns:
        `[O, I]` in `dtype`.
    """
    values = e2m1_to_float(unpack_fp4(weight_packed))  # [O, I] fp32
    _check_groups(values, "the unpacked weight")
    effective_scale = weight_scale.float() / weight_global_scale.float()  # [O, G]
    grouped = values.unflatten(-1, (-1, GROUP_SIZE)) * effective_scale.unsqueeze(-1)  # [O, G, 16]
    return grouped.flatten(-2).to(dtype)  # [O, I]


# ---- activations ------------------------------------------------------------------------------------------------


def quantize_dequantize_nvfp4_activation(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """Fake-quantize activations the way an NVFP4 checkpoint runs them (spec F.2, `dynamic: "local"`).

    The global scale is static (from calibration); the FP8 scale of each group of 16 is computed from `x` at run
    time, then `x` is rounded to E2M1 and scaled back. Matches compressed-tensors' `forward_quantize` for the
    NVFP4 preset.

    Args:
        x: `[..., I]` activations, `I` a multiple of 16.
        input_global_scale: `[1]` fp32.

    Returns:
        `[..., I]` in `x`'s dtype, every group holding `e2m1 · scale_g / global` values.
    """
    global_scale = input_global_scale.float().reshape(1)
    effective_scale = nvfp4_group_scales(x, global_scale) / global_scale  # [..., G] fp32
    codes = _round_groups_to_e2m1(x, effective_scale)  # [..., I] uint8
    values = e2m1_to_float(codes).unflatten(-1, (-1, GROUP_SIZE))  # [..., G, 16] fp32
    return (values * effective_scale.unsqueeze(-1)).flatten(-2).to(x.dtype)  # [..., I]


def nvfp4_linear(
    x: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_global_scale: torch.Tensor,
    input_global_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """NVFP4 linear by dequantization: fake-quantize `x` (if `input_global_scale` is given), dequantize the weight
    to `x`'s dtype, matmul.

    Args:
        x: `[..., I]` activations.
        weight_packed: `[O, I/2]` uint8.
        weight_scale: `[O, G]` float8_e4m3fn.
        weight_global_scale: `[1]` fp32.
        input_global_scale: `[1]` fp32, or None for weight-only quantization.
        bias: optional `[O]`.

    Returns:
        `[..., O]` in `x`'s dtype.
    """
    if input_global_scale is not None:
        x = quantize_dequantize_nvfp4_activation(x, input_global_scale)  # [..., I]
    weight = dequantize_nvfp4_weight(weight_packed, weight_scale, weight_global_scale, x.dtype)  # [O, I]
    return F.linear(x, weight, None if bias is None else bias.to(x.dtype))  # [..., O]


# ---- module -----------------------------------------------------------------------------------------------------


class NVFP4Linear(nn.Module):
    """Linear layer holding a compressed-tensors NVFP4 weight (spec F.2).

    State-dict keys match the checkpoint: `weight_packed` uint8 `[O, I/2]`, `weight_scale` float8_e4m3fn `[O, G]`,
    `weight_global_scale` fp32 `[1]`, `input_global_scale` fp32 `[1]` (absent when activations stay unquantized),
    optional `bias` `[O]`. These dtypes survive `module.to(dtype)`.

    The forward fake-quantizes the activation, dequantizes the weight for this call only and runs a dense matmul.
    Native FP4 kernels need Blackwell GPUs and are not used here, so NVFP4 saves memory, not compute.

    Args:
        in_features: I, a multiple of 16.
        out_features: O.
        bias: whether to hold a bias.
        dtype: model dtype (of `bias`; the forward computes in the input's dtype).
        device: where to allocate.
        quantize_input: hold an `input_global_scale` and fake-quantize activations (the NVFP4 preset); False for
            weight-only NVFP4.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        quantize_input: bool = True,
    ) -> None:
        super().__init__()
        if in_features % GROUP_SIZE:
            raise ValueError(
                f"NVFP4Linear needs in_features to be a multiple of {GROUP_SIZE}, got {in_features}; "
                "keep this layer unquantized."
            )
        self.in_features = in_features
        self.out_features = out_features
        groups = in_features // GROUP_SIZE

        def frozen(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t, requires_grad=False)

        self.weight_packed = frozen(torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.weight_scale = frozen(torch.ones(out_features, groups, dtype=FP8_DTYPE, device=device))  # [O, G]
        self.weight_global_scale = frozen(torch.ones(1, dtype=torch.float32, device=device))
        if quantize_input:
            self.input_global_scale = frozen(torch.ones(1, dtype=torch.float32, device=device))
        else:
            self.register_parameter("input_global_scale", None)
        if bias:
            self.bias = frozen(torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, input_global_scale: torch.Tensor | float | None = None
    ) -> "NVFP4Linear":
        """Quantize an existing `nn.Linear`.

        Args:
            linear: the dense layer; left unchanged.
            input_global_scale: static activation global scale (e.g. `nvfp4_global_scale(calibration_inputs)`);
                None keeps activations unquantized.

        Returns:
            A new `NVFP4Linear` on `linear`'s device.
        """
        weight = linear.weight.detach()
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            dtype=weight.dtype,
            device=weight.device,
            quantize_input=input_global_scale is not None,
        )
        weight_packed, weight_scale, weight_global_scale = quantize_nvfp4_weight(weight)
        module.weight_packed.data.copy_(weight_packed)
        module.weight_scale.data.copy_(weight_scale)
        module.weight_global_scale.data.copy_(weight_global_scale)
        if input_global_scale is not None:
            module.input_global_scale.data.copy_(torch.as_tensor(input_global_scale, dtype=torch.float32))
        if linear.bias is not None:
            module.bias.data.copy_(linear.bias.detach())
        return module

    def dequantized_weight(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Dense `[O, I]` weight in `dtype`."""
        return dequantize_nvfp4_weight(self.weight_packed, self.weight_scale, self.weight_global_scale, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`[..., I]` -> `[..., O]` in `x`'s dtype."""
        return nvfp4_linear(
            x, self.weight_packed, self.weight_scale, self.weight_global_scale, self.input_global_scale, self.bias
        )

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - signature of nn.Module._apply
        fixed = [self.weight_scale, self.weight_global_scale, self.input_global_scale]
        return super()._apply(dtype_preserving_fn(fn, fixed), recurse)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"quantize_input={self.input_global_scale is not None}"
        )
