"""The one text layer class, used in both modes (spec C.5-C.7).

Legend: B batch, T tokens, H hidden.
"""

import torch
from torch import nn

from .attention import DiffusionGemmaAttention, PassContext
from .blocks import GatedMLP, RMSNorm
from .config import DiffusionGemmaTextConfig, LayerShape
from .moe import Experts, Router


class DiffusionGemmaLayer(nn.Module):
    """Attention, then a dense MLP in parallel with the routed experts, each with its own norms.

    Parameter names follow the checkpoint (`input_layernorm`, `experts.gate_up_proj`, `layer_scalar`, ...).
    `layer_scalar` is the decoder-mode scalar; the encoder-mode one is a separate checkpoint buffer (spec B.2) that the
    caller passes in.
    """

    def __init__(self, config: DiffusionGemmaTextConfig, shape: LayerShape):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = DiffusionGemmaAttention(H, config.num_attention_heads, shape, eps, config.attention_bias)
        self.mlp = GatedMLP(H, config.intermediate_size)
        self.input_layernorm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.pre_feedforward_layernorm = RMSNorm(H, eps)
        self.post_feedforward_layernorm = RMSNorm(H, eps)
        self.router = Router(H, config.num_experts, config.top_k_experts, eps)
        self.experts = Experts(config.num_experts, H, config.moe_intermediate_size)
        self.post_feedforward_layernorm_1 = RMSNorm(H, eps)  # dense branch output (HF "_1" = dense)
        self.post_feedforward_layernorm_2 = RMSNorm(H, eps)  # MoE branch output
        self.pre_feedforward_layernorm_2 = RMSNorm(H, eps)  # MoE branch input
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x: torch.Tensor, ctx: PassContext, layer_idx: int, layer_scalar: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> [B, T, H]."""
        attn = self.self_attn(self.input_layernorm(x), ctx, layer_idx)
        return self.feed_forward(x, attn, layer_scalar)

    def feed_forward(self, x: torch.Tensor, attn: torch.Tensor, layer_scalar: torch.Tensor) -> torch.Tensor:
        """Everything after attention: residual, dense MLP and routed experts in parallel. x, attn [B, T, H]."""
        x1 = x + self.post_attention_layernorm(attn)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x1)))
        flat = x1.reshape(-1, x1.shape[-1])  # [B*T, H]
        top_w, top_i = self.router(flat)  # the router reads the un-normalized residual (pitfall H.5)
        moe = self.experts(self.pre_feedforward_layernorm_2(flat), top_i, top_w).reshape(x1.shape)
        y = x1 + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(moe))
        return y * layer_scalar  # spec C.7: the scalar multiplies the whole residual stream
