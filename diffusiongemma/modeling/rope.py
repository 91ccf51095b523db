"""Rotary position embeddings: "default" and Gemma 4's "proportional" variant (spec C.3).

Legend: T tokens, D head dim, F = D/2 frequencies.
"""

import torch


def rope_inv_freq(rope: dict, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [F] (fp32) for one layer type.

    "default": the first `int(D * partial_rotary_factor)` dims rotate, exponent denominator is that width.
    "proportional" (spec C.3, pitfall H.4): `a = int(p * D // 2)` rotated frequencies with exponent denominator the
    full D, then D/2 - a zero frequencies so the remaining dims pass through; always length D/2.
    """
    rope_type = rope.get("rope_type", "default")
    theta = rope["rope_theta"]
    factor = rope.get("partial_rotary_factor", 1.0)
    if rope_type == "default":
        dim = int(head_dim * factor)
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    if rope_type == "proportional":
        rotated = int(factor * head_dim // 2)
        inv = 1.0 / (theta ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float) / head_dim))
        inv = inv / rope.get("factor", 1.0)
        return torch.cat([inv, torch.zeros(head_dim // 2 - rotated)])
    raise ValueError(f"rope_type must be 'default' or 'proportional', got {rope_type!r}")


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [B or 1, T, D] computed in fp32 from float positions [B or 1, T], cast to `dtype` (spec C.3)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device, torch.float)  # [B, T, F]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation: dim j pairs with j + D/2. x [B, T, N, D], cos/sin [B or 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
