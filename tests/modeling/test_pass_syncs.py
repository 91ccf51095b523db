"""The model's passes make no host synchronisation (issue 17): `encode`, `denoise` and `head` as `generate` calls them.

A padded batch reads where its padding is once per padding vector (`PaddingSlots`, remembered on the cache); every
later pass with the same vector reads nothing. The CUDA twin (tests/cuda/test_sync_cuda.py) also catches the syncs
this patch cannot see (boolean-mask indexing, blocking host-to-device copies).

The tiny config has expert widths the CPU grouped_mm accepts; the looped fallback for other widths reads the expert
counts on the host (one sync per MoE layer), which CUDA never takes (grouped_mm on sm80+).
"""

import pytest
import torch

from conftest import tiny_config, tiny_model
from diffusiongemma.modeling.masks import PaddingSlots, build_decoder_masks
from sync_count import count_host_syncs

pytestmark = pytest.mark.usefixtures("one_thread")
B, P, L = 2, 10, 16


def model_for(attn: str):
    config = tiny_config()
    config._attn_implementation = attn
    return tiny_model(config)


def padding(batch: int, slots: int, pads: list[int]) -> torch.Tensor:
    """keep [B, slots]: row b has pads[b] left-padding slots."""
    return torch.arange(slots)[None] >= torch.tensor(pads)[:, None]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "flex_attention"])
@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_encode_denoise_head_passes_make_no_host_sync(attn, padded):
    model = model_for(attn)
    g = torch.Generator().manual_seed(0)
    ids, canvas = torch.randint(3, 128, (B, P), generator=g), torch.randint(3, 128, (B, L), generator=g)
    keep = padding(B, P + 2 * L, [0, 4]) if padded else None
    cache = model.new_cache()
    with count_host_syncs() as encode_syncs:
        model.encode(ids, cache, keep=keep)
    with count_host_syncs() as first:  # a padded batch reads its padding here, once
        logits = model.head(model.denoise(canvas, cache, None, keep=keep))
    per_pass = []
    for _ in range(3):  # later steps, with self-conditioning, then a commit pass and the next canvas
        with count_host_syncs() as syncs:
            soft = model.get_decoder().soft_embedding(logits)
            logits = model.head(model.denoise(canvas, cache, soft, keep=keep))
        per_pass.append(syncs.total)
    with count_host_syncs() as commit:
        model.encode(canvas, cache, keep=keep)
    with count_host_syncs() as next_canvas:
        model.head(model.denoise(canvas, cache, None, keep=keep))
    assert encode_syncs.total == 0, encode_syncs.calls
    assert first.total == (1 if padded else 0), first.calls
    assert per_pass == [0, 0, 0]
    assert commit.total == 0 and next_canvas.total == 0, (commit.calls, next_canvas.calls)


@torch.no_grad()
def test_generate_passes_make_no_host_sync(monkeypatch):
    """Every encode/denoise/head call inside generate (reference and fast lock-step, padded): no sync. generate
    reads where the padding is once, before the first step."""
    model = model_for("sdpa")
    ids = torch.randint(3, 128, (B, P), generator=torch.Generator().manual_seed(1))
    mask = padding(B, P, [3, 0]).long()
    counts = {"encode": [], "denoise": [], "head": []}
    for name in counts:
        inner = getattr(model, name)

        def counted(*args, _inner=inner, _name=name, **kwargs):
            with count_host_syncs() as syncs:
                out = _inner(*args, **kwargs)
            counts[_name].append(syncs.total)
            return out

        monkeypatch.setattr(model, name, counted)
    kw = dict(attention_mask=mask, max_new_tokens=2 * L, max_denoising_steps=4, stability_threshold=0,
              confidence_threshold=1e-9)
    model.generate(ids, **kw)
    model.generate(ids, sampling="fast", seed=0, batching="lockstep", **kw)
    assert len(counts["denoise"]) >= 8 and len(counts["encode"]) >= 4
    assert set(counts["encode"]) == {0} and set(counts["head"]) == {0}
    assert set(counts["denoise"]) == {0}, counts["denoise"]


def test_padding_slots_are_read_once_and_reread_after_an_in_place_change():
    keep = padding(2, 12, [0, 3])
    with count_host_syncs() as syncs:
        slots = PaddingSlots.of(keep)
        again = PaddingSlots.of(keep, slots)
    assert syncs.total == 1 and again is slots and slots.slots == (0, 1, 2)
    assert slots.any_in(2, 5) and not slots.any_in(3, 12) and not slots.any_in(0, 0)
    keep[0, 7] = False  # the same tensor, changed in place: read again
    changed = PaddingSlots.of(keep, slots)
    assert changed is not slots and changed.slots == (0, 1, 2, 7)
    assert PaddingSlots.of(keep.clone(), changed) is not changed  # another tensor


def test_decoder_masks_only_where_the_key_view_holds_padding():
    """The sliding view [S-W+1, S) moves past the left padding; the full layer's view always holds it."""
    shapes = model_for("sdpa").get_decoder().type_shapes  # window 8
    keep = padding(2, 40, [0, 3])
    info = PaddingSlots.of(keep)
    early = build_decoder_masks(shapes, 6, L, info, 2, torch.device("cpu"))  # sliding view [0, 6): padding
    late = build_decoder_masks(shapes, 20, L, info, 2, torch.device("cpu"))  # sliding view [13, 20): none
    assert early["sliding_attention"].mask is not None and late["sliding_attention"].mask is None
    assert early["full_attention"].mask is not None and late["full_attention"].mask is not None
    want = keep[:, :20].clone()
    assert torch.equal(late["full_attention"].mask[:, 0, 0, :20], want)  # [B, 1, L, S+L]: the cached part
    assert bool(late["full_attention"].mask[:, :, :, 20:].all())  # the canvas is always visible
