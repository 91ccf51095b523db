"""Routed experts (modeling/moe.py): sorted dispatch, grouped and per-expert paths, order-preserving combine."""

import pytest
import torch

from diffusiongemma.modeling.moe import Experts, combine, per_expert_ffn, sorted_dispatch


def test_sorted_dispatch_groups_by_expert_in_torch_sort_order():
    top_i = torch.tensor([[2, 0], [0, 1], [2, 1]])  # T = 3 tokens, k = 2
    order, tokens, counts = sorted_dispatch(top_i, num_experts=4)
    # flat assignments [2, 0, 0, 1, 2, 1]: expert 0 at flat 1, 2; expert 1 at 3, 5; expert 2 at 0, 4
    assert top_i.reshape(-1)[order].tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(order, torch.sort(top_i.reshape(-1)).indices)  # the built-in's tie order (pitfall H.19)
    assert torch.equal(tokens, order // 2)
    assert counts == [2, 2, 2, 0]


def test_grouped_rows_follow_torch_sort_not_a_stable_sort():
    """With many ties torch.sort's order differs from a stable argsort; the grouped path must use torch.sort's."""
    top_i = torch.randint(0, 3, (400, 2), generator=torch.Generator().manual_seed(0))
    flat = top_i.reshape(-1)
    assert not torch.equal(torch.sort(flat).indices, torch.argsort(flat, stable=True))  # the premise
    assert torch.equal(sorted_dispatch(top_i, 3)[0], torch.sort(flat).indices)


def test_combine_sums_each_tokens_slots():
    top_i = torch.tensor([[1, 0], [0, 1]])
    order, _, _ = sorted_dispatch(top_i, 2)  # flat [1, 0, 0, 1] -> order [1, 2, 0, 3]
    weighted = torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # rows in sorted order
    # unsorted: flat 1 -> 1, flat 2 -> 2, flat 0 -> 3, flat 3 -> 4; token 0 = 3 + 1, token 1 = 2 + 4
    assert combine(weighted, order, top_i).tolist() == [[4.0], [6.0]]


def reference_experts(experts: Experts, x, top_w, top_i):
    """Plain per-token loop."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(top_i.shape[1]):
            e = int(top_i[t, j])
            gate_up, down = experts.gate_up_proj[e], experts.down_proj[e]
            g, u = (x[t] @ gate_up.t()).chunk(2)
            out[t] += top_w[t, j] * ((torch.nn.functional.gelu(g, approximate="tanh") * u) @ down.t())
    return out


def test_experts_match_a_plain_loop_on_both_paths():
    torch.manual_seed(0)
    experts = Experts(4, 16, 8)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(experts.down_proj, std=0.3)
    x = torch.randn(10, 16)
    top_w, top_i = torch.rand(10, 2), torch.stack([torch.randperm(4)[:2] for _ in range(10)])
    expected = reference_experts(experts, x, top_w, top_i)
    torch.testing.assert_close(experts(x, top_i, top_w), expected, atol=1e-5, rtol=1e-5)
    per_expert = per_expert_ffn(x, top_w, top_i, experts.gate_up_proj, experts.down_proj)
    torch.testing.assert_close(per_expert, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unaligned_experts_take_the_built_in_eager_arithmetic(dtype):
    """Expert width 7: CPU grouped_mm refuses the rows, so the forward must equal the built-in's eager loop: rows in
    (slot, token) order, weighted outputs cast to the activation dtype and added expert by expert."""
    torch.manual_seed(1)
    E, H, I, T, k = 5, 12, 7, 9, 3
    experts = Experts(E, H, I).to(dtype)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(experts.down_proj, std=0.3)
    x = torch.randn(T, H).to(dtype)
    top_w, top_i = torch.rand(T, k), torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    expected = torch.zeros_like(x)
    for e in range(E):
        slot, token = torch.where(top_i.t() == e)
        if len(token):
            g, u = torch.nn.functional.linear(x[token], experts.gate_up_proj[e]).chunk(2, dim=-1)
            y = torch.nn.functional.linear(torch.nn.functional.gelu(g, approximate="tanh") * u, experts.down_proj[e])
            expected.index_add_(0, token, (y * top_w[token, slot, None]).to(dtype))
    assert torch.equal(experts(x, top_i, top_w), expected)
