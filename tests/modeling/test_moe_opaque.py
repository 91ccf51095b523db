"""The opaque grouped GEMM (modeling/moe.py) that lets the MoE trace under torch.compile in fp32: the same values and
gradients as `torch._grouped_mm`, and a fake implementation that passes `torch.library.opcheck`."""

import torch

from diffusiongemma.modeling.moe import opaque_grouped_mm


def test_opaque_grouped_mm_matches_grouped_mm_with_gradients_and_traces():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10, 8, generator=g, requires_grad=True)  # 10 rows sorted by expert
    w = torch.randn(3, 12, 8, generator=g, requires_grad=True)  # 3 experts, [E, N, K] as the checkpoint stores them
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # expert 1 gets no rows
    expected = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    got = opaque_grouped_mm(a, w.transpose(-2, -1), offs)
    assert torch.equal(got, expected)
    up = torch.randn(expected.shape, generator=g)
    for x, y in zip(torch.autograd.grad(got, (a, w), up), torch.autograd.grad(expected, (a, w), up)):
        torch.testing.assert_close(x, y)
    torch.library.opcheck(opaque_grouped_mm, (a, w.transpose(-2, -1), offs))  # fake impl, autograd, AOT tracing
