"""Mask predicates and their two materializers (modeling/masks.py)."""

import torch
from torch.nn.attention.flex_attention import create_mask

from diffusiongemma.modeling.attention import eager_attention, sdpa_attention
from diffusiongemma.modeling.masks import and_masks, causal, dense_mask, key_padding, sliding_window


def test_sliding_window_counts_the_query():
    # W = 3, queries at slots 4..5, keys from slot 2: query 4 sees slots 2, 3, 4 (q - k < 3)
    mod = and_masks(causal(4, 2), sliding_window(3, 4, 2))
    mask = dense_mask(mod, 1, 2, 4, torch.device("cpu"))[0, 0]
    assert mask.tolist() == [[True, True, True, False], [False, True, True, True]]


def test_padding_rows_stay_fully_masked_and_finite():
    keep = torch.tensor([[False, False, True]])
    mask = dense_mask(and_masks(causal(0, 0), key_padding(keep, 0)), 1, 3, 3, torch.device("cpu"))
    # queries 0 and 1 see only padding -> fully masked, as in the reference; query 2 sees itself
    assert mask[0, 0].tolist() == [[False, False, False], [False, False, False], [False, False, True]]
    q, k, v = torch.randn(3, 1, 2, 3, 4).unbind(0)
    # SDPA gives zeros for a fully masked row, eager attention (dtype-min fill) the mean of the values: the
    # reference's outputs for padding queries, which become the padding slots' cache entries (pitfall H.12)
    sdpa = sdpa_attention(q, k, v, mask)
    assert torch.equal(sdpa[:, :, :2], torch.zeros_like(sdpa[:, :, :2]))
    eager = eager_attention(q, k, v, mask)
    torch.testing.assert_close(eager[:, :, :2], v.mean(dim=2, keepdim=True).expand(1, 2, 2, 4))


def test_block_mask_predicate_equals_dense_mask():
    keep = torch.tensor([[False, True, True, True, True, True, True, True], [True] * 8])
    mod = and_masks(causal(3, 1), sliding_window(4, 3, 1), key_padding(keep, 1))
    dense = dense_mask(mod, 2, 5, 7, torch.device("cpu"))
    flex = create_mask(mod, 2, None, 5, 7, device="cpu")  # what create_block_mask evaluates, element-wise
    assert torch.equal(dense, flex)
