"""Mask predicates and their two materializers (modeling/masks.py)."""

import torch
from torch.nn.attention.flex_attention import create_mask

from diffusiongemma.modeling.masks import and_masks, causal, dense_mask, key_padding, sliding_window


def test_sliding_window_counts_the_query():
    # W = 3, queries at slots 4..5, keys from slot 2: query 4 sees slots 2, 3, 4 (q - k < 3)
    mod = and_masks(causal(4, 2), sliding_window(3, 4, 2))
    mask = dense_mask(mod, 1, 2, 4, torch.device("cpu"))[0, 0]
    assert mask.tolist() == [[True, True, True, False], [False, True, True, True]]


def test_padding_rows_open_instead_of_nan():
    keep = torch.tensor([[False, False, True]])
    mask = dense_mask(and_masks(causal(0, 0), key_padding(keep, 0)), 1, 3, 3, torch.device("cpu"))[0, 0]
    # queries 0 and 1 see only padding -> opened to every key; query 2 sees itself
    assert mask.tolist() == [[True, True, True], [True, True, True], [False, False, True]]


def test_block_mask_predicate_equals_dense_mask():
    keep = torch.tensor([[False, True, True, True, True, True, True, True], [True] * 8])
    mod = and_masks(causal(3, 1), sliding_window(4, 3, 1), key_padding(keep, 1))
    dense = dense_mask(mod, 2, 5, 7, torch.device("cpu"))
    flex = create_mask(mod, 2, None, 5, 7, device="cpu")  # what create_block_mask evaluates, element-wise
    assert torch.equal(dense, flex)
