"""Routed experts (modeling/moe.py): sorted dispatch, grouped vs looped GEMMs, order-preserving combine."""

import torch

from diffusiongemma.modeling.moe import Experts, combine, looped_expert_ffn, sorted_dispatch


def test_sorted_dispatch_groups_by_expert_keeping_token_order():
    top_i = torch.tensor([[2, 0], [0, 1], [2, 1]])  # T = 3 tokens, k = 2
    order, tokens, counts = sorted_dispatch(top_i, num_experts=4)
    # flat assignments [2, 0, 0, 1, 2, 1]: expert 0 at flat 1, 2; expert 1 at 3, 5; expert 2 at 0, 4
    assert order.tolist() == [1, 2, 3, 5, 0, 4]
    assert tokens.tolist() == [0, 1, 1, 2, 0, 2]
    assert counts == [2, 2, 2, 0]


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
    torch.testing.assert_close(experts(x, top_w, top_i), expected, atol=1e-5, rtol=1e-5)
    order, tokens, counts = sorted_dispatch(top_i, 4)
    y = looped_expert_ffn(x[tokens], counts, experts.expert_weights)
    looped = combine(y * top_w.reshape(-1)[order, None], order, top_i)
    torch.testing.assert_close(looped, expected, atol=1e-5, rtol=1e-5)
