"""The dual-mode attention module (spec C.5).

One module serves both modes; the caller decides the mode by what it passes: the finished mask and whether the cache
write persists (encoder: causal, writes the prefix; decoder: bidirectional, writes only the reserved canvas slot).

Legend: B batch, T tokens in this pass, KV keys attended, H hidden, N query heads, K kv heads, D head dim.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import LayerShape
from .blocks import RMSNorm
from .masks import LayerMask, widen_mask
from .rope import apply_rope


@dataclass
class PassContext:
    """Everything one forward pass of the stack shares across layers, built once per pass.

    Attributes:
        cos_sin: per layer type, RoPE tables [B or 1, T, D].
        masks: per layer type, the finished `LayerMask`.
        cache: the `BlockDiffusionCache` read (and written) by this pass.
        persist: True in encoder mode (writes become prefix), False in decoder mode (canvas slot only).
        backend: "sdpa", "eager" or "flex".
    """

    cos_sin: dict
    masks: dict
    cache: object
    persist: bool
    backend: str


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Reference math for debugging: scores q.k^T with scaling 1.0, softmax in fp32. q [B,N,T,D], k/v [B,K,KV,D]."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # [B, N, KV, D]
    v = v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-1, -2)  # [B, N, T, KV]
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v  # [B, N, T, D]


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """More query heads than kv heads. A branch, not `q.shape[1] != k.shape[1]` itself: under torch.compile with
    dynamic shapes that comparison is a symbolic bool, which SDPA and flex_attention refuse (a graph break)."""
    return True if q.shape[1] != k.shape[1] else False


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """PyTorch SDPA with native GQA (no repeated K/V copies) and scaling 1.0 (spec C.5)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=is_gqa(q, k))


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """torch's flex_attention with a `BlockMask` from masks.py (None = no mask), scaling 1.0, native GQA.

    Without torch.compile it runs PyTorch's unfused reference path (correct, slower than SDPA on CPU);
    `generate(compile=True)` (modeling/compile.py) compiles it into the fused kernel.
    """
    from torch.nn.attention.flex_attention import flex_attention as flex

    return flex(q, k, v, block_mask=mask, scale=1.0, enable_gqa=is_gqa(q, k))


ATTENTION_FUNCTIONS = {"sdpa": sdpa_attention, "eager": eager_attention, "flex": flex_attention}


class DiffusionGemmaAttention(nn.Module):
    """Gemma 4 attention with q/k/v norms; full layers reuse the raw key projection as values ("k_eq_v").

    Args:
        hidden_size: H.
        num_heads: N.
        shape: this layer's geometry (K, D, window).
        eps: RMSNorm epsilon.
    """

    def __init__(self, hidden_size: int, num_heads: int, shape: LayerShape, eps: float, bias: bool = False):
        super().__init__()
        self.shape = shape
        self.num_heads = num_heads
        self.head_dim = D = shape.head_dim
        K = shape.num_kv_heads
        if num_heads % K:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({K})")
        self.q_proj = nn.Linear(hidden_size, num_heads * D, bias=bias)
        self.k_proj = nn.Linear(hidden_size, K * D, bias=bias)
        # spec C.5 / A.2: full-attention layers never have v_proj; V = v_norm(raw k_proj output)
        self.v_proj = nn.Linear(hidden_size, K * D, bias=bias) if shape.is_sliding else None
        self.o_proj = nn.Linear(num_heads * D, hidden_size, bias=bias)
        self.q_norm = RMSNorm(D, eps)
        self.k_norm = RMSNorm(D, eps)
        self.v_norm = RMSNorm(D, eps, with_scale=False)

    def project(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h [B, T, H] (already input-normed) -> q [B, N, T, D], k and v [B, K, T, D], normed, q/k rotated."""
        B, T, _ = h.shape
        q = apply_rope(self.q_norm(self.q_proj(h).view(B, T, -1, self.head_dim)), cos, sin)  # [B, T, N, D]
        raw_k = self.k_proj(h).view(B, T, -1, self.head_dim)  # [B, T, K, D]
        raw_v = self.v_proj(h).view(B, T, -1, self.head_dim) if self.v_proj is not None else raw_k
        k = apply_rope(self.k_norm(raw_k), cos, sin)
        v = self.v_norm(raw_v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, backend: str) -> torch.Tensor:
        """q [B, N, T, D], cached k/v [B, K, KV, D], the finished mask -> o_proj output [B, T, H]."""
        B, _, T, _ = q.shape
        out = ATTENTION_FUNCTIONS[backend](q, k, v, mask)  # [B, N, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def forward(self, h: torch.Tensor, ctx: PassContext, layer_idx: int) -> torch.Tensor:
        """h [B, T, H] (already input-normed) -> [B, T, H]: project, write the cache, attend."""
        cos, sin = ctx.cos_sin[self.shape.layer_type]
        mask: LayerMask = ctx.masks[self.shape.layer_type]
        q, k, v = self.project(h, cos, sin)
        k, v = ctx.cache.write(layer_idx, k, v, mask.kv_start, ctx.persist)  # [B, K, KV, D]
        visible, extra = mask.mask, k.shape[2] - (mask.kv_end - mask.kv_start)
        if extra > 0:  # a cache that pads the keys (diffusers_views.PipelineStaticCache): hide the padding
            if ctx.backend == "flex":
                raise ValueError("a zero-padded key buffer needs a dense mask (sdpa or eager), not flex")
            visible = widen_mask(visible, q.shape[0], q.shape[2], mask.kv_end - mask.kv_start, k.shape[2], q.device)
        return self.attend(q, k, v, visible, ctx.backend)
