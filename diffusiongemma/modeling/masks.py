"""Every attention mask the model needs, built in one place (spec C.4, C.10).

Masks are predicates `f(b, h, q, kv) -> bool` over *relative* query/key indices (the signature of
`torch.nn.attention.flex_attention` mask_mods); each predicate closes over the absolute cache slot of its first
query and first key. Combine them with `and_masks` / `or_masks`, then materialize once per forward and layer type:
`dense_mask` (bool [B, 1, Q, KV] for SDPA/eager) or `block_mask` (a flex_attention `BlockMask`). Attention receives a
finished mask.

Slots: the KV cache stores token t of the sequence at slot t (left padding included, positions equal slots), and the
canvas being denoised sits in the slots right after the committed prefix.

Denoising passes have two mask builders. `build_decoder_masks` (exact, eager default) sizes each layer's key view on
the host, [kv_start, S+L), and gives no mask where nothing is hidden, as the reference does. `build_static_decoder_masks`
(the compiled pass, cache.py's `StaticCacheView`) keys every layer over the whole capacity [0, C) and hides, from the
device-side S, the slots past the canvas and the cached slots a sliding layer dropped: the mask is [B, 1, L, C]
whatever S is, so the pass keeps its shapes from step to step and canvas to canvas.

Training on several canvases at once (BD3-LM's vectorized form): `build_canvas_training_masks` lets K noisy canvases
share one denoising pass over a cache holding the clean prompt and canvases; each sees its clean prefix and itself.

Legend: B batch, Q queries in this pass, KV keys attended, S committed (cached) length, W sliding window,
L canvas length, C cache capacity (slots), P prompt slots, K canvases of a training pass.
"""

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable

import torch

from .config import LayerShape

DECODER_WINDOWS = ("reference", "symmetric")  # sliding-layer semantics of a denoising pass (build_decoder_masks)

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def and_masks(*mods: MaskMod) -> MaskMod:
    def mod(b, h, q, kv):
        out = mods[0](b, h, q, kv)
        for m in mods[1:]:
            out = out & m(b, h, q, kv)
        return out

    return mod


def or_masks(*mods: MaskMod) -> MaskMod:
    def mod(b, h, q, kv):
        out = mods[0](b, h, q, kv)
        for m in mods[1:]:
            out = out | m(b, h, q, kv)
        return out

    return mod


def causal(q_slot0: int, kv_slot0: int) -> MaskMod:
    """Key slot <= query slot (encoder mode)."""
    return lambda b, h, q, kv: (kv + kv_slot0) <= (q + q_slot0)


def sliding_window(window: int, q_slot0: int, kv_slot0: int) -> MaskMod:
    """q - W < k: the query sees itself and the previous W-1 slots (spec C.4: the window counts the query)."""
    return lambda b, h, q, kv: (q + q_slot0) - (kv + kv_slot0) < window


def symmetric_window(window: int, q_slot0: int, kv_slot0: int) -> MaskMod:
    """|q - k| <= W' (non-causal encoder with use_bidirectional_attention == "all", spec C.10)."""
    return lambda b, h, q, kv: ((q + q_slot0) - (kv + kv_slot0)).abs() <= window


def key_padding(keep: torch.Tensor, kv_slot0: int) -> MaskMod:
    """keep [B, slots] bool: False marks a padding slot that no query may see."""
    return lambda b, h, q, kv: keep[b, kv + kv_slot0]


def same_image(groups: torch.Tensor, q_slot0, kv_slot0, groups_slot0) -> MaskMod:
    """A query and a key of the same image see each other (the "vision" overlay, spec C.4).

    groups [B, T]: the image of each slot in [groups_slot0, groups_slot0 + T) (-1 for text); slots outside (the cache)
    count as text. The slot offsets are ints, or [B] tensors for a mixed-phase pass (one start per row).
    """
    T = groups.shape[1]

    def mod(b, h, q, kv):
        q_local = q + _at(q_slot0, b) - _at(groups_slot0, b)
        kv_local = kv + _at(kv_slot0, b) - _at(groups_slot0, b)
        inside = (kv_local >= 0) & (kv_local < T) & (q_local < T)
        q_group = groups[b, q_local.clamp(0, T - 1)]
        kv_group = groups[b, kv_local.clamp(0, T - 1)]
        return inside & (q_group >= 0) & (q_group == kv_group)

    return mod


def _at(offset, b):
    return offset[b] if isinstance(offset, torch.Tensor) else offset


def dense_mask(mod: MaskMod, batch: int, num_q: int, num_kv: int, device: torch.device) -> torch.Tensor:
    """Materialize a predicate as a bool tensor [B, 1, Q, KV] for SDPA / eager.

    Fully masked query rows (left-padding queries in encoder mode) stay fully masked, as in the reference: SDPA
    returns zeros for them and eager attention (dtype-min fill) a uniform average, both finite (pitfall H.12). Their
    outputs become the cache entries of the padding slots, which a decoder pass without a padding mask reads.
    """
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(num_q, device=device)[None, None, :, None]
    kv = torch.arange(num_kv, device=device)[None, None, None, :]
    return mod(b, h, q, kv).expand(batch, 1, num_q, num_kv)


def block_mask(mod: MaskMod, batch: int, num_q: int, num_kv: int, device: torch.device):
    """Materialize a predicate as a flex_attention `BlockMask` (the same predicate as `dense_mask`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mod, batch, None, num_q, num_kv, device=device)


def materialize(mod: MaskMod, batch: int, num_q: int, num_kv: int, device: torch.device, backend: str):
    """`block_mask` for the "flex" backend, else `dense_mask`."""
    if backend == "flex":
        return block_mask(mod, batch, num_q, num_kv, device)
    return dense_mask(mod, batch, num_q, num_kv, device)


@dataclass
class LayerMask:
    """What one attention call needs: the key slot range and the finished mask (None = attend to all of it):
    bool [B, 1, Q, KV] for sdpa/eager, a `BlockMask` for flex."""

    kv_start: int
    kv_end: int
    mask: object | None


def widen_mask(mask: torch.Tensor | None, batch: int, num_q: int, visible: int, total: int,
               device: torch.device) -> torch.Tensor:
    """A bool mask [B, 1, Q, visible] (None: every key visible) widened to `total` keys, the extra ones hidden.

    For a cache that hands attention a longer, zero-padded key buffer than the mask's slot range
    (`diffusers_views.PipelineStaticCache`, which lays keys out as transformers' StaticCache does). sdpa/eager only.
    """
    out = torch.zeros(batch, 1, num_q, total, dtype=torch.bool, device=device)  # [B, 1, Q, total]
    out[..., :visible] = True if mask is None else mask
    return out


def _first_visible_slot(shape: LayerShape, q_slot0: int) -> int:
    # Sliding layers retain only the last W-1 committed slots (spec C.10, DynamicCache semantics).
    if shape.is_sliding:
        return max(q_slot0 - (shape.sliding_window - 1), 0)
    return 0


def build_encoder_masks(
    shapes: dict[str, LayerShape],
    q_slot0: int,
    num_q: int,
    keep: torch.Tensor | None,
    causal_encoder: bool,
    batch: int,
    device: torch.device,
    backend: str = "sdpa",
    vision_groups: torch.Tensor | None = None,
) -> dict[str, LayerMask]:
    """Masks for an encoder pass writing slots [q_slot0, q_slot0 + Q), one per layer type.

    Args:
        shapes: one representative `LayerShape` per layer type.
        keep: [B, >= q_slot0 + Q] bool padding vector over slots, or None for no padding.
        causal_encoder: False only for `use_bidirectional_attention == "all"`.
        backend: "flex" builds `BlockMask`s, anything else dense masks.
        vision_groups: [B, Q] image of each query token (-1 text): tokens of one image also see each other, on both
            layer types, ORed onto the causal (and window) pattern before padding is applied (spec C.4).
    """
    out = {}
    for layer_type, shape in shapes.items():
        kv0 = _first_visible_slot(shape, q_slot0)
        kv1 = q_slot0 + num_q
        mods = []
        if causal_encoder:
            mods.append(causal(q_slot0, kv0))
            if shape.is_sliding:
                mods.append(sliding_window(shape.sliding_window, q_slot0, kv0))
        elif shape.is_sliding:
            mods.append(symmetric_window(shape.sliding_window, q_slot0, kv0))
        if vision_groups is not None and causal_encoder:
            mods = [or_masks(and_masks(*mods), same_image(vision_groups, q_slot0, kv0, q_slot0))]
        if keep is not None:
            mods.append(key_padding(keep, kv0))
        mask = None
        if mods:
            mask = materialize(and_masks(*mods), batch, num_q, kv1 - kv0, device, backend)
        out[layer_type] = LayerMask(kv0, kv1, mask)
    return out


@dataclass(frozen=True)
class PaddingSlots:
    """Where a padding vector keep [B, slots] has padding, copied to the host once.

    A denoising pass needs a mask only when its key view holds a padding slot (otherwise attention gets no mask, as in
    the reference). Reading that from `keep` every pass would be a host sync per pass; the slots are read once per
    padding vector (`of`) and every later pass with the same, unmodified vector asks the host copy.

    Attributes:
        keep: the padding vector itself (the mask is built from it).
        version: `keep._version` when read (an in-place change makes the copy stale).
        slots: sorted slots where some row is padding.
    """

    keep: torch.Tensor
    version: int
    slots: tuple[int, ...]

    @classmethod
    def of(cls, keep: torch.Tensor, previous: "PaddingSlots | None" = None) -> "PaddingSlots":
        """The host copy for `keep`: `previous` when it describes the same unmodified tensor, else read now (one
        host sync)."""
        if previous is not None and previous.keep is keep and previous.version == keep._version:
            return previous
        padded = (~keep).any(dim=0).tolist()  # [slots] bool: the one host read for this padding vector
        return cls(keep, keep._version, tuple(i for i, p in enumerate(padded) if p))

    def any_in(self, start: int, end: int) -> bool:
        """Some slot in [start, end) is padding."""
        i = bisect_left(self.slots, start)
        return i < len(self.slots) and self.slots[i] < end


def build_decoder_masks(
    shapes: dict[str, LayerShape],
    cached: int,
    canvas_length: int,
    padding: PaddingSlots | None,
    batch: int,
    device: torch.device,
    backend: str = "sdpa",
    window: str = "reference",
) -> dict[str, LayerMask]:
    """Masks for a denoising pass: the canvas (slots [S, S+L)) attends bidirectionally to itself and to the cache.

    Full layers see every cached slot; sliding layers see the same last W-1 cached slots for every canvas query, with
    no window inside the canvas (spec C.10, sdpa/eager + DynamicCache reference). `padding` describes the padding
    vector keep [B, >= S]; a layer whose key view holds no padding slot gets no mask (decided on the host).
    window="symmetric" is a semantics switch that names an engine difference (docs/reference-accuracy.md): sliding
    layers then also require |q - k| <= W-1, the reference's flash-attention window (spec C.10, E), so canvas query j
    loses the j oldest of those cached slots.
    """
    if window not in DECODER_WINDOWS:
        raise ValueError(f"decoder window must be one of {DECODER_WINDOWS}, got {window!r}")
    out = {}
    for layer_type, shape in shapes.items():
        kv0 = _first_visible_slot(shape, cached)
        kv1 = cached + canvas_length
        mods = []
        if padding is not None and padding.any_in(kv0, cached):
            full_keep = torch.ones(batch, kv1, dtype=torch.bool, device=device)
            full_keep[:, kv0:cached] = padding.keep[:, kv0:cached]
            mods.append(key_padding(full_keep, kv0))
        if window == "symmetric" and shape.is_sliding and kv1 - 1 - kv0 > shape.sliding_window - 1:
            mods.append(symmetric_window(shape.sliding_window - 1, cached, kv0))
        mask = materialize(and_masks(*mods), batch, canvas_length, kv1 - kv0, device, backend) if mods else None
        out[layer_type] = LayerMask(kv0, kv1, mask)
    return out


def fit_keep(keep: torch.Tensor, capacity: int) -> torch.Tensor:
    """keep [B, slots] -> [B, C]: cut at the capacity, or extended with True (slots past the padding vector)."""
    B, slots = keep.shape
    if slots >= capacity:
        return keep[:, :capacity]
    return torch.cat([keep, keep.new_ones(B, capacity - slots)], dim=1)


def static_decoder_window(shape: LayerShape, cached: torch.Tensor, canvas_length: int, window: str) -> MaskMod:
    """What a denoising query may see in a static pass, over cache slots [0, C) (kv_slot0 = 0, q_slot0 = S).

    The same sets as `build_decoder_masks`: the canvas [S, S+L) and, for full layers, every cached slot; for sliding
    layers only the last W-1 cached slots (spec C.10); window="symmetric" also requires |q - k| <= W-1 there. Slots
    at or past S+L (not written yet) are never visible. `cached` is S as a [] device tensor, or [B] S_b per row (a
    mixed pass over a `RowCache`: the same sets per row as `build_row_masks` gives a denoising row).
    """
    W = shape.sliding_window

    def mod(b, h, q, kv):
        cached_b = _row_value(cached, b)
        visible = kv < cached_b + canvas_length
        if shape.is_sliding:
            visible = visible & (kv > cached_b - W)  # kv >= S - (W-1)
            if window == "symmetric":
                visible = visible & ((q + cached_b) - kv).abs().le(W - 1)
        return visible

    return mod


def _row_value(cached: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """S for batch row(s) b: the shared [] S itself, or S_b of a per-row [B] tensor."""
    return cached[b] if cached.dim() else cached


def build_static_decoder_masks(
    shapes: dict[str, LayerShape],
    cached: torch.Tensor,
    canvas_length: int,
    capacity: int,
    keep: torch.Tensor | None,
    batch: int,
    device: torch.device,
    backend: str = "sdpa",
    window: str = "reference",
) -> dict[str, LayerMask]:
    """Masks of fixed shape for a denoising pass over a static cache: canvas [S, S+L) against all C slots.

    Args:
        cached: S, the committed slots, as a [] long tensor on the device (`BlockDiffusionCache.length_t`), or [B]
            S_b per row (`RowCache.lengths_t`): nothing here reads it on the host, so a compiled pass neither syncs
            nor specializes on it.
        capacity: C, the slots of the cache buffers (every layer's key view).
        keep: [B, slots] bool padding vector (False: padding, hidden from every query); None for no padding. Only
            cached slots (< S) are masked by it, as in `build_decoder_masks`.
    Returns:
        per layer type, `LayerMask(0, C, mask)`: bool [B, 1, L, C] for sdpa/eager, a `BlockMask` for flex.
    """
    if window not in DECODER_WINDOWS:
        raise ValueError(f"decoder window must be one of {DECODER_WINDOWS}, got {window!r}")
    padded = fit_keep(keep, capacity) if keep is not None else None  # [B, C]
    out = {}
    for layer_type, shape in shapes.items():
        mods = [static_decoder_window(shape, cached, canvas_length, window)]
        if padded is not None:
            mods.append(or_masks(key_padding(padded, 0), lambda b, h, q, kv: kv >= _row_value(cached, b)))
        mask = materialize(and_masks(*mods), batch, canvas_length, capacity, device, backend)
        out[layer_type] = LayerMask(0, capacity, mask)
    return out


def build_row_masks(
    shapes: dict[str, LayerShape],
    starts: torch.Tensor,
    start_range: tuple[int, int],
    q_lens: torch.Tensor,
    encoder_rows: torch.Tensor,
    num_q: int,
    causal_encoder: bool,
    device: torch.device,
    backend: str = "sdpa",
    vision_groups: torch.Tensor | None = None,
    window: str = "reference",
) -> dict[str, LayerMask]:
    """Masks for a mixed-phase pass (`RowCache`): row b writes its q_len_b tokens at slots [S_b, S_b + q_len_b).

    Per row, the causal flag decides the pattern: encoder rows (prefill or commit) attend causally with the sliding
    window, exactly as `build_encoder_masks`; denoising rows attend bidirectionally to their whole canvas and to the
    committed prefix, as `build_decoder_masks`. Every row sees only its own written slots; sliding layers retain the
    last W-1 committed slots of each row. Queries past q_len_b (padding) see what a real query of the row would.

    Args:
        starts: [B] committed slots S_b per row (on the device).
        start_range: (min S_b, max S_b) as host ints: they size the key view, and reading them from `starts` would be
            a host sync.
        q_lens: [B] real tokens per row in this pass (<= num_q).
        encoder_rows: [B] bool, True for the causal rows.
        num_q: T, the query length of the pass (the longest row).
        vision_groups: [B, T] image of each row's token (-1 text; only prefill rows have images): an encoder row's
            tokens of one image also see each other, as in `build_encoder_masks`.
        window: the denoising rows' sliding-layer semantics, as `build_decoder_masks` ("symmetric": |q - k| <= W-1).
    """
    if window not in DECODER_WINDOWS:
        raise ValueError(f"decoder window must be one of {DECODER_WINDOWS}, got {window!r}")
    first_start, last_start = start_range
    out = {}
    for layer_type, shape in shapes.items():
        kv0 = _first_visible_slot(shape, first_start)
        kv1 = last_start + num_q
        overlay = None
        if vision_groups is not None and causal_encoder:
            overlay = same_image(vision_groups, starts, kv0, starts)  # row tokens are left-aligned at S_b

        def mod(b, h, q, kv, shape=shape, kv0=kv0, overlay=overlay):
            start = starts[b]
            q_slot, kv_slot = q + start, kv + kv0
            visible = kv_slot < start + q_lens[b]  # only this row's written slots
            if shape.is_sliding:  # the row's cache keeps its last W-1 committed slots
                visible = visible & (kv_slot > start - shape.sliding_window)
            if causal_encoder:
                encoder = kv_slot <= q_slot
                if shape.is_sliding:
                    encoder = encoder & (q_slot - kv_slot < shape.sliding_window)
            elif shape.is_sliding:
                encoder = (q_slot - kv_slot).abs() <= shape.sliding_window
            else:
                encoder = torch.ones_like(visible)
            if overlay is not None:
                encoder = encoder | overlay(b, h, q, kv)
            if window == "symmetric" and shape.is_sliding:  # a denoising row then also keeps |q - k| <= W-1
                decoder = (q_slot - kv_slot).abs() < shape.sliding_window
                return visible & torch.where(encoder_rows[b], encoder, decoder)
            return visible & (encoder | ~encoder_rows[b])

        out[layer_type] = LayerMask(kv0, kv1, materialize(mod, len(starts), num_q, kv1 - kv0, device, backend))
    return out


def noisy_canvas_view(shape: LayerShape, prompt: int, canvas_length: int, cached: int, window: str) -> MaskMod:
    """What a noisy canvas may see in a multi-canvas training pass (kv_slot0 = 0, keys = cache slots then queries).

    Queries are K noisy canvases laid end to end (query q belongs to canvas k = q // L, at position P + q); keys are the
    S cached clean slots [0, S) followed by the K*L noisy tokens. Canvas k sees the clean slots before its own first
    position P + kL (sliding layers: only the last W-1 of them, spec C.10) and every noisy token of canvas k, nothing
    of the other noisy canvases: exactly what a denoising pass over canvas k alone, after encoding its clean prefix,
    sees. window="symmetric" also requires |q - k| <= W-1 on sliding layers, as `build_decoder_masks`.
    """
    W, L = shape.sliding_window, canvas_length

    def mod(b, h, q, kv):
        canvas = q // L
        start = prompt + canvas * L  # slot (and position) of the canvas's first token
        clean = kv < cached
        prefix = clean & (kv < start)
        if shape.is_sliding:
            prefix = prefix & (kv > start - W)  # kv >= start - (W-1)
        visible = prefix | (~clean & ((kv - cached) // L == canvas))
        if window == "symmetric" and shape.is_sliding:
            key_position = torch.where(clean, kv, kv - cached + prompt)
            visible = visible & ((q + prompt) - key_position).abs().le(W - 1)
        return visible

    return mod


def build_canvas_training_masks(
    shapes: dict[str, LayerShape],
    prompt: int,
    canvas_length: int,
    canvases: int,
    cached: int,
    keep: torch.Tensor | None,
    batch: int,
    device: torch.device,
    backend: str = "sdpa",
    window: str = "reference",
) -> dict[str, LayerMask]:
    """Masks for one denoising pass over K noisy canvases against a cache of their clean prompt and canvases.

    Args:
        prompt: P, the slots of the (left-padded) prompt; clean canvas k sits at slots [P + kL, P + (k+1)L).
        canvases: K; the pass has K*L queries at positions P .. P + KL - 1.
        cached: S, the clean slots in the cache (at least P + (K-1)L: canvas K-1's prefix).
        keep: [B, >= P] bool padding vector (False: padding, hidden from every query); slots past it are real.
    Returns:
        per layer type, `LayerMask(0, S + KL, mask)`: bool [B, 1, KL, S + KL] for sdpa/eager, a `BlockMask` for flex.
    """
    if window not in DECODER_WINDOWS:
        raise ValueError(f"decoder window must be one of {DECODER_WINDOWS}, got {window!r}")
    if cached < prompt + (canvases - 1) * canvas_length:
        raise ValueError(f"the cache holds {cached} slots, fewer than the prefix of the last canvas "
                         f"({prompt} + {canvases - 1} x {canvas_length})")
    num_q = canvases * canvas_length
    num_kv = cached + num_q
    padded = fit_keep(keep, num_kv) if keep is not None else None  # [B, S + KL]
    out = {}
    for layer_type, shape in shapes.items():
        mods = [noisy_canvas_view(shape, prompt, canvas_length, cached, window)]
        if padded is not None:
            mods.append(key_padding(padded, 0))
        out[layer_type] = LayerMask(0, num_kv, materialize(and_masks(*mods), batch, num_q, num_kv, device, backend))
    return out
