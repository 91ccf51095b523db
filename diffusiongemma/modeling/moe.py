"""Router and routed experts of the Gemma 4 MoE block (spec C.6).

Dispatch sorts the (token, expert) assignments by expert and runs one matmul per active expert on a contiguous
block of rows, instead of masked gathers over the whole batch per expert.

Legend: T tokens (flattened batch), H hidden, E experts, k experts per token, I expert intermediate (Im).
"""

import torch
import torch.nn.functional as F
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
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(gelu_tanh(gate) * up, down)


def sorted_dispatch(top_i: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Group assignments by expert.

    Returns (order [T*k] indices into the flattened assignments sorted by expert, token of each sorted row [T*k],
    per-expert row counts as a Python list [E]).
    """
    flat = top_i.reshape(-1)  # [T*k]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, order // top_i.shape[1], counts


def _grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def can_use_grouped_mm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One grouped GEMM for all experts: CUDA sm80+, or CPU (torch >= 2.9 has a kernel) with 16-byte aligned rows.

    transformers' built-in experts take this path by default on the same devices; matching it keeps reference-mode
    sampling bit-exact.
    """
    if _grouped_mm_fn() is None or (torch.compiler.is_compiling() and weight.dtype != torch.bfloat16):
        return False  # inductor lowers grouped_mm for bf16 only
    if weight.is_cuda:
        return torch.cuda.get_device_capability(weight.device) >= (8, 0)
    aligned = all(n * x.element_size() % 16 == 0 for n in (weight.shape[-1], weight.shape[-2] // 2))
    return weight.device.type == "cpu" and aligned


def grouped_expert_ffn(rows: torch.Tensor, counts: list[int], gate_up: torch.Tensor, down: torch.Tensor):
    """Every expert in two grouped GEMMs: rows [R, H] sorted by expert, counts [E], gate_up [E, 2I, H],
    down [E, H, I] -> [R, H]."""
    grouped_mm = _grouped_mm_fn()
    offsets = torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(rows.device)  # [E]
    gate, up = grouped_mm(rows, gate_up.transpose(-2, -1), offs=offsets).chunk(2, dim=-1)  # [R, I] each
    return grouped_mm(gelu_tanh(gate) * up, down.transpose(-2, -1), offs=offsets)


def looped_expert_ffn(rows: torch.Tensor, counts: list[int], expert_weights) -> torch.Tensor:
    """Fallback: one pair of GEMMs per active expert on its contiguous block of rows. rows [R, H] -> [R, H]."""
    out = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            gate_up, down = expert_weights(e)
            out[start : start + n] = expert_ffn(rows[start : start + n], gate_up, down)
            start += n
    return out


def combine(weighted: torch.Tensor, order: torch.Tensor, top_i: torch.Tensor) -> torch.Tensor:
    """Undo the sort and add each token's k weighted expert outputs: weighted [T*k, H] (sorted) -> [T, H].

    A reshape + sum in slot order (deterministic, no `index_add_`, which also crawls when its threads compete for a
    busy CPU). This is the built-in class's own arithmetic on CPU and CUDA, so results match it bit for bit.
    """
    T, k = top_i.shape
    unsorted = torch.empty_like(weighted)
    unsorted[order] = weighted
    return unsorted.view(T, k, -1).sum(dim=1)


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
        rows = x[tokens]  # [T*k, H], contiguous per expert
        if can_use_grouped_mm(rows, self.gate_up_proj):
            y = grouped_expert_ffn(rows, counts, self.gate_up_proj, self.down_proj)
        else:
            y = looped_expert_ffn(rows, counts, self.expert_weights)
        weighted = y * top_w.reshape(-1)[order, None]  # [T*k, H], fp32 weights
        return combine(weighted, order, top_i).to(x.dtype)
