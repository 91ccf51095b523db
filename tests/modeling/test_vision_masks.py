"""The "vision" overlay of the encoder masks (modeling/masks.py `same_image`, modeling/vision.py `vision_groups`)."""

import torch
from torch.nn.attention.flex_attention import create_mask

from diffusiongemma.modeling.config import LayerShape
from diffusiongemma.modeling.masks import (and_masks, build_encoder_masks, build_row_masks, causal, dense_mask,
                                           or_masks, same_image, sliding_window)
from diffusiongemma.modeling.vision import vision_groups

CPU = torch.device("cpu")
SLIDING = LayerShape("sliding_attention", 4, 1, 2, {})  # W = 2: a query sees itself and the slot before
FULL = LayerShape("full_attention", 4, 1, None, {})


def test_vision_groups_number_each_run_of_media_tokens():
    types = torch.tensor([[0, 1, 1, 0, 1, 2, 0], [1, 1, 0, 0, 0, 0, 1]])
    # row 0: run [1, 2] is image 0, run [4, 5] (image then video type: one contiguous run) is image 1
    # row 1: numbering restarts per row
    assert vision_groups(types).tolist() == [[-1, 0, 0, -1, 1, 1, -1], [0, 0, -1, -1, -1, -1, 1]]


def test_image_tokens_see_each_other_across_the_sliding_window():
    groups = torch.tensor([[-1, 0, 0, 0, -1, -1]])  # slots 1-3 are one image
    masks = build_encoder_masks({"sliding_attention": SLIDING}, 0, 6, None, True, 1, CPU, "sdpa", groups)
    got = masks["sliding_attention"].mask[0, 0].int().tolist()
    # window 2 alone gives the band k in {q-1, q}; the image adds 1 <-> 3 and the future slots 2, 3 for queries 1, 2
    assert got == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]


def test_padding_still_wins_over_the_overlay():
    groups = torch.tensor([[0, 0, -1]])
    keep = torch.tensor([[False, True, True]])  # slot 0 is padding: no query may see it, image or not
    masks = build_encoder_masks({"full_attention": FULL}, 0, 3, keep, True, 1, CPU, "sdpa", groups)
    assert masks["full_attention"].mask[0, 0].int().tolist() == [[0, 1, 0], [0, 1, 0], [0, 1, 1]]


def test_cached_slots_count_as_text():
    # a pass writing slots 3..5 after 3 cached ones: groups cover the pass only; the cache is text
    groups = torch.tensor([[0, 0, -1]])
    masks = build_encoder_masks({"full_attention": FULL}, 3, 3, None, True, 1, CPU, "sdpa", groups)
    assert masks["full_attention"].mask[0, 0].int().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0],
                                                                  [1, 1, 1, 1, 1, 1]]


def test_no_overlay_for_a_non_causal_encoder():
    groups = torch.tensor([[0, 0, 0]])
    with_groups = build_encoder_masks({"full_attention": FULL}, 0, 3, None, False, 1, CPU, "sdpa", groups)
    without = build_encoder_masks({"full_attention": FULL}, 0, 3, None, False, 1, CPU, "sdpa")
    assert with_groups["full_attention"].mask is None and without["full_attention"].mask is None


def test_flex_predicate_equals_dense_mask():
    groups = torch.tensor([[-1, 0, 0, 0, 0, -1], [1, 1, -1, 2, 2, 2]])
    mod = or_masks(and_masks(causal(2, 0), sliding_window(3, 2, 0)), same_image(groups, 2, 0, 2))
    dense = dense_mask(mod, 2, 6, 8, CPU)
    flex = create_mask(mod, 2, None, 6, 8, device="cpu")
    assert torch.equal(dense, flex)


def test_mixed_pass_overlay_applies_to_prefill_rows_as_in_an_encoder_pass():
    # row 0: a prefill of 4 tokens at slot 0 with an image at 1-2; row 1: a 2-token commit at slot 3 (no images)
    groups = torch.tensor([[-1, 0, 0, -1], [-1, -1, -1, -1]])
    rows = build_row_masks({"full_attention": FULL}, torch.tensor([0, 3]), (0, 3), torch.tensor([4, 2]),
                           torch.tensor([True, True]), 4, True, CPU, "sdpa", groups)["full_attention"].mask
    alone = build_encoder_masks({"full_attention": FULL}, 0, 4, None, True, 1, CPU, "sdpa", groups[:1])
    assert torch.equal(rows[0, 0, :, :4], alone["full_attention"].mask[0, 0])
    assert not rows[0, 0, :, 4:].any()
    # row 1 stays causal over its own slots 0..4
    assert rows[1, 0, :2, :5].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
