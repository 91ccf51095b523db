"""Router and routed experts of the Gemma 4 MoE block (spec C.6).

Dispatch sorts the (token, expert) assignments by expert and runs one matmul per active expert on a contiguous
block of rows, instead of masked gathers over the whole batch per expert.

Legend: T tokens (flattened batch), H hidden, E experts, k experts per token, I expert intermediate (Im).
"""

import torch
from torch import nn

from .blocks import RMSNorm, gelu_tanh


class Router(nn.Module):
    """Top-k router reading the un-normalized residual (pitfall H.5)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, eps: float):
        super().__init__()
        self.top_k = top_k
        self.root_size = hidden_size**-0.5  # a Python float, as in spec C.6
        self.norm = RMSNorm(hidden_size, eps, with_scale=False)
        self.proj = nn.Linear(hidden_size, num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k] fp32, expert ids [T, k])."""
        scores = self.proj(self.norm(x) * self.scale * self.root_size)  # [T, E]
        probs = scores.softmax(dim=-1, dtype=torch.float32)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return top_w * self.per_expert_scale[top_i], top_i


def expert_ffn(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert: x [R, H], gate_up [2I, H] (rows [0, I) gate), down [H, I] -> [R, H]."""
    gate, up = (x @ gate_up.t()).chunk(2, dim=-1)
    return (gelu_tanh(gate) * up) @ down.t()


def sorted_dispatch(top_i: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Group assignments by expert.

    Returns (order [T*k] indices into the flattened assignments sorted by expert, token of each sorted row [T*k],
    per-expert row counts as a Python list [E]).
    """
    flat = top_i.reshape(-1)  # [T*k]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, order // top_i.shape[1], counts


class Experts(nn.Module):
    """Fused 3-D expert weights, as stored by the checkpoint (spec B.1)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def expert_weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I, H], down [H, I]) of expert e, dense in the compute dtype."""
        return self.gate_up_proj[e], self.down_proj[e]

    def forward(self, x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor) -> torch.Tensor:
        """x [T, H] (pre_feedforward_layernorm_2 output), top_w/top_i [T, k] -> [T, H]."""
        order, tokens, counts = sorted_dispatch(top_i, self.num_experts)
        weights = top_w.reshape(-1)[order]  # [T*k] fp32
        rows = x[tokens]  # [T*k, H], contiguous per expert
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            gate_up, down = self.expert_weights(e)
            y = expert_ffn(rows[start : start + n], gate_up, down)  # [n, H]
            y = y * weights[start : start + n, None]
            out.index_add_(0, tokens[start : start + n], y.to(out.dtype))
            start += n
        return out
