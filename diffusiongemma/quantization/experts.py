"""Routed experts as one small module per expert: the layout quantized checkpoints use (spec F.3).

compressed-tensors only compresses Linear-like modules, and the fused 3-D `experts.gate_up_proj` /
`experts.down_proj` parameters of the base checkpoint are not Linears. Quantized releases therefore store every
expert as three Linears, `experts.{e}.gate_proj`, `experts.{e}.up_proj` and `experts.{e}.down_proj`; gate is the
first half of the fused `gate_up_proj` rows, up the second half (spec F.4). `ExpertList` holds exactly those
modules (dense `nn.Linear`, `FP8Linear` or `NVFP4Linear`), so its state-dict keys are the checkpoint keys, and runs
the same sorted dispatch as `modeling.moe.Experts`. Quantized weights stay compressed; each Linear dequantizes its
own weight for the call, one expert at a time.

Legend: T tokens (flattened batch), H hidden, I expert intermediate (Im), E experts, k experts per token.
"""

import torch
from torch import nn

from diffusiongemma.modeling.blocks import gelu_tanh
from diffusiongemma.modeling.moe import Experts, combine, sorted_dispatch


class ExpertMLP(nn.Module):
    """One expert: `down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))`, three Linear-like children."""

    def __init__(self, hidden_size: int, intermediate_size: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False, device=device, dtype=dtype)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False, device=device, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, H] -> [R, H]."""
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class ExpertList(nn.ModuleList):
    """E `ExpertMLP`s named `0..E-1`; a drop-in for `modeling.moe.Experts` with the per-expert checkpoint keys."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__(ExpertMLP(hidden_size, intermediate_size, device, dtype) for _ in range(num_experts))
        self.num_experts = num_experts

    def forward(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """x [T, H] (pre_feedforward_layernorm_2 output), top_i/top_w [T, k] -> [T, H] (`Experts.forward`'s order)."""
        order, tokens, counts = sorted_dispatch(top_i, self.num_experts)
        rows = x[tokens]  # [T*k, H], contiguous per expert
        y = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(counts):
            if n:
                y[start : start + n] = self[e](rows[start : start + n])  # each Linear quantizes its own input
                start += n
        weighted = y * top_w.reshape(-1)[order, None]  # [T*k, H], fp32 weights
        return combine(weighted, order, top_i).to(x.dtype)


@torch.no_grad()
def unfuse_experts(experts: Experts) -> ExpertList:
    """Dense per-expert Linears holding the same weights as fused `experts` (gate = rows [0, I), up = [I, 2I)).

    Args:
        experts: fused `Experts` with gate_up_proj [E, 2I, H] and down_proj [E, H, I].

    Returns:
        An `ExpertList` on the same device and dtype (copies; `experts` is left unchanged).
    """
    E, two_i, H = experts.gate_up_proj.shape
    inter = two_i // 2
    out = ExpertList(E, H, inter, device=experts.gate_up_proj.device, dtype=experts.gate_up_proj.dtype)
    for e, expert in enumerate(out):
        expert.gate_proj.weight.copy_(experts.gate_up_proj[e, :inter])
        expert.up_proj.weight.copy_(experts.gate_up_proj[e, inter:])
        expert.down_proj.weight.copy_(experts.down_proj[e])
    return out


def unfuse_model_experts(model: nn.Module) -> nn.Module:
    """Replace every fused `Experts` in `model` by an equivalent dense `ExpertList` (in place; returns `model`)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Experts):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, unfuse_experts(module))
    return model


def empty_expert_lists(model: nn.Module, device: torch.device | str = "meta") -> nn.Module:
    """Replace every fused `Experts` by an uninitialized `ExpertList` of the same shape on `device` (in place)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Experts):
            E, two_i, H = module.gate_up_proj.shape
            parent, _, child = name.rpartition(".")
            replacement = ExpertList(E, H, two_i // 2, device=device, dtype=module.gate_up_proj.dtype)
            setattr(model.get_submodule(parent), child, replacement)
    return model
