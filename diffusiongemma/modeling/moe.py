"""Router and routed experts of the Gemma 4 MoE block (spec C.6).

Two dispatch paths, each the arithmetic of the transformers built-in path that runs on the same tensors, so logits
match it bit for bit:

* grouped (CPU with 16-byte aligned rows, CUDA sm80+): the (token, slot) assignments are sorted by expert with
  `torch.sort` (not a stable argsort: CPU `grouped_mm` computes a row differently depending on where it sits in its
  block, so the order inside an expert's block must be the built-in's), two grouped GEMMs run every expert at once,
  and each token sums its k weighted outputs in slot order;
* per expert (everything else, e.g. rows whose byte size is not a multiple of 16, where the CPU `grouped_mm` kernel
  refuses to run and the built-in needs `experts_implementation="eager"`): the built-in eager loop's order: an
  expert's rows in (slot, token) order, its weighted output added into the result with `index_add_` expert by expert.

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
    """Group assignments by expert, in `torch.sort`'s order (the built-in's; see the module docstring).

    Returns (order [T*k] indices into the flattened assignments sorted by expert, token of each sorted row [T*k],
    per-expert row counts as a Python list [E]).
    """
    flat = top_i.reshape(-1)  # [T*k]
    order = torch.sort(flat).indices
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, order // top_i.shape[1], counts


def _grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


# CUDA's grouped_mm kernel takes bf16 only: other dtypes fall back to a loop that reads `offs` on the host, which a
# CUDA graph cannot capture (found on the first H200 run: "Cannot copy between CPU and CUDA tensors during CUDA graph
# capture"). The tag makes inductor keep this op outside captured graphs (partition or skip) instead of failing.
_CUDAGRAPH_UNSAFE = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


@torch.library.custom_op("diffusiongemma::grouped_mm", mutates_args=(), tags=_CUDAGRAPH_UNSAFE)
def opaque_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """`grouped_mm(a, b, offs=offs)` as one opaque op: a [R, K] x b [E, K, N] -> [R, N], or (the weight gradient)
    a [K, R] x b [R, N] -> [E, K, N].

    torch.compile traces grouped_mm for bf16 only; under compile other dtypes go through this op, which runs the same
    eager kernel, so the graph does not break and the arithmetic is the eager one.
    """
    return _grouped_mm_fn()(a, b, offs=offs)


@opaque_grouped_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    if b.dim() == 3:
        return a.new_empty(a.shape[0], b.shape[-1])
    return a.new_empty(offs.shape[0], a.shape[0], b.shape[-1])


def _save_grouped_mm_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _grouped_mm_backward(ctx, grad):
    a, b, offs = ctx.saved_tensors  # a [R, K], b [E, K, N], grad [R, N]
    grad = grad.contiguous()  # the kernel wants real strides; an upstream sum may hand over an expanded tensor
    grad_a = opaque_grouped_mm(grad, b.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    grad_b = opaque_grouped_mm(a.transpose(0, 1), grad, offs) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


opaque_grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_save_grouped_mm_inputs)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """torch's grouped_mm; under torch.compile in a dtype it cannot trace, the opaque op around the same kernel."""
    if torch.compiler.is_compiling() and a.dtype != torch.bfloat16:
        return opaque_grouped_mm(a, b, offs)
    return _grouped_mm_fn()(a, b, offs=offs)


def can_use_grouped_mm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One grouped GEMM for all experts: CUDA sm80+ or CPU (torch >= 2.9 has a kernel), with 16-byte aligned rows.

    transformers' built-in experts take this path by default on the same devices; matching it keeps reference-mode
    sampling bit-exact. The kernel refuses rows (H or I values) that are not a multiple of 16 bytes ("strides should
    be multiple of 16 bytes"); there the built-in needs `experts_implementation="eager"`, whose arithmetic
    `per_expert_ffn` reproduces.
    """
    if _grouped_mm_fn() is None:
        return False
    if not all(n * x.element_size() % 16 == 0 for n in (weight.shape[-1], weight.shape[-2] // 2)):
        return False
    if weight.is_cuda:
        return torch.cuda.get_device_properties(weight.device).major >= 8  # sm80+; torch.compile folds this call
    return weight.device.type == "cpu"


def expert_offsets(top_i: torch.Tensor, order: torch.Tensor, num_experts: int) -> torch.Tensor:
    """End row of every expert's block after sorting, int32 [E] (the `offs` of grouped_mm).

    Computed on the device with a fixed shape: no host sync, nothing data-dependent for torch.compile.
    """
    sorted_ids = top_i.reshape(-1)[order]  # [T*k] ascending
    experts = torch.arange(num_experts, device=top_i.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32)


def grouped_expert_ffn(rows: torch.Tensor, offsets: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor):
    """Every expert in two grouped GEMMs: rows [R, H] sorted by expert, offsets int32 [E] (end row of each expert),
    gate_up [E, 2I, H], down [E, H, I] -> [R, H]."""
    gate, up = grouped_mm(rows, gate_up.transpose(-2, -1), offsets).chunk(2, dim=-1)  # [R, I] each
    return grouped_mm(gelu_tanh(gate) * up, down.transpose(-2, -1), offsets)


def per_expert_ffn(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor) -> torch.Tensor:
    """Fallback: one pair of GEMMs per routed expert, accumulated like the built-in eager loop.

    x [T, H], top_w/top_i [T, k], gate_up [E, 2I, H], down [E, H, I] -> [T, H] in x's dtype. Expert e's rows are
    taken in (slot, token) order and its weighted output, cast to x's dtype, is added with `index_add_`, experts in
    ascending order. One host read (the experts hit), as every per-expert loop needs.
    """
    out = torch.zeros_like(x)
    for e in torch.unique(top_i).tolist():  # ascending
        if e >= gate_up.shape[0]:  # expert parallelism: another rank's expert (see `Experts.forward`)
            continue
        slot, token = torch.where(top_i.t() == e)  # [k, T] -> slot-major order
        y = expert_ffn(x[token], gate_up[e], down[e]) * top_w[token, slot, None]  # [R, H]
        out.index_add_(0, token, y.to(out.dtype))
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

    def forward(self, x: torch.Tensor, top_i: torch.Tensor, top_w: torch.Tensor) -> torch.Tensor:
        """x [T, H] (pre_feedforward_layernorm_2 output), top_i/top_w [T, k] -> [T, H].

        The argument order is transformers' experts convention (hidden_states, top_k_index, top_k_weights), which its
        tensor- and expert-parallel hooks call positionally. Under expert parallelism `num_experts` is this rank's
        count and an id equal to it marks a route to another rank's expert (weight 0): those rows add nothing.
        """
        if not can_use_grouped_mm(x, self.gate_up_proj):
            return per_expert_ffn(x, top_w, top_i, self.gate_up_proj, self.down_proj)
        order = torch.sort(top_i.reshape(-1)).indices  # as sorted_dispatch, without the host counts
        rows = x[order // top_i.shape[1]]  # [T*k, H], contiguous per expert
        y = grouped_expert_ffn(rows, expert_offsets(top_i, order, self.num_experts), self.gate_up_proj,
                               self.down_proj)
        weighted = y * top_w.reshape(-1)[order, None]  # [T*k, H], fp32 weights
        if getattr(self, "_is_expert_parallel", False):  # set by transformers' expert-parallel sharding
            # rows past the last expert's block are never written by grouped_mm: drop them, whatever they hold
            weighted = torch.where(top_i.reshape(-1)[order, None] < self.num_experts, weighted, 0.0)
        return combine(weighted, order, top_i).to(x.dtype)
