"""The one text stack, used in two modes: `encode` (causal, writes the cache) and `denoise` (bidirectional canvas).

`denoise` reads the cache it is given: a `BlockDiffusionCache` (exact views sized on the host, the eager default) or a
`StaticCacheView` (whole capacity, S on the device, every shape fixed: the compiled pass, modeling/compile.py).

Legend: B batch, T tokens of an encoder pass, L canvas length, S committed slots, C cache capacity, H hidden, V vocab.
"""

from dataclasses import replace

import torch
from torch import nn

from .attention import PassContext
from .blocks import RMSNorm, ScaledEmbedding, SelfConditioning
from .cache import BlockDiffusionCache, RecordingLayerCache, RowCache, StaticCacheView
from .config import DiffusionGemmaTextConfig, encoder_is_causal, layer_shape
from .layers import DiffusionGemmaLayer
from .host import device_tensor, to_device
from .masks import (PaddingSlots, build_decoder_masks, build_encoder_masks, build_row_masks,
                    build_static_decoder_masks)
from .rope import rope_cos_sin, rope_inv_freq
from .vision import scatter_images


class DiffusionGemmaTextStack(nn.Module):
    """Embeddings, the layers, the final norm and self-conditioning; shared by encoder and decoder mode.

    It sits at `model.decoder` because the checkpoint stores the shared text weights under that prefix (spec B.2).
    """

    def __init__(self, config: DiffusionGemmaTextConfig):
        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        self.shapes = [layer_shape(config, i) for i in range(config.num_hidden_layers)]
        self.type_shapes = {s.layer_type: s for s in self.shapes}  # one representative per layer type
        self.causal_encoder = encoder_is_causal(config)
        self.embed_tokens = ScaledEmbedding(config.vocab_size, H, config.pad_token_id)
        self.layers = nn.ModuleList(DiffusionGemmaLayer(config, s) for s in self.shapes)
        self.norm = RMSNorm(H, eps)
        self.self_conditioning = SelfConditioning(H, config.intermediate_size, eps)
        self._inv_freq: dict = {}  # (layer type, device) -> RoPE inverse frequencies [D/2] fp32, see `_rope`
        self.gradient_checkpointing = False  # set by `model.gradient_checkpointing_enable()`
        self._gradient_checkpointing_func = None
        # semantics switch (docs/reference-accuracy.md): "symmetric" gives denoising passes the |q - k| <= W-1 window
        self.decoder_window = getattr(config, "decoder_window", "reference")

    def new_cache(self, capacity: int = 0) -> BlockDiffusionCache:
        return BlockDiffusionCache(self.shapes, capacity)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> dict:
        """positions [B or 1, T] -> per layer type (cos, sin) [B or 1, T, D].

        The inverse frequencies are computed on the host once per device and kept there: copying them every pass
        would be a blocking host-to-device copy (a sync) on CUDA. A plain dict, not buffers, so meta-device loading
        leaves nothing uninitialized.
        """
        out = {}
        for t, s in self.type_shapes.items():
            key = (t, positions.device)
            if key not in self._inv_freq:
                self._inv_freq[key] = to_device(rope_inv_freq(s.rope, s.head_dim), positions.device)
            out[t] = rope_cos_sin(self._inv_freq[key], positions, dtype)
        return out

    def _run(self, x: torch.Tensor, ctx: PassContext, scalars: list[torch.Tensor], collect: list | None) -> torch.Tensor:
        checkpointing = self.gradient_checkpointing and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            x = self._checkpointed_layer(x, ctx, i, scalars[i]) if checkpointing else layer(x, ctx, i, scalars[i])
            if collect is not None:
                collect.append(x)
        return self.norm(x)

    def _checkpointed_layer(self, x: torch.Tensor, ctx: PassContext, i: int, scalar: torch.Tensor) -> torch.Tensor:
        """Layer i under activation checkpointing, writing the cache exactly once.

        The layer writes into a `RecordingLayerCache` built inside the checkpointed function from the prefix captured
        now, so the backward recompute reads the same prefix and its write is thrown away. The prefix tensors are
        explicit checkpoint inputs, so gradients reach earlier cache writes under reentrant checkpointing too.
        """
        cache, length = ctx.cache, ctx.cache.length
        prefix = () if cache.keys[i] is None else (cache.keys[i], cache.values[i])

        def run(x, *prefix):
            view = RecordingLayerCache(*(prefix or (None, None)), length)
            out = self.layers[i](x, replace(ctx, cache=view), i, scalar)
            return out, view.keys, view.values

        out, keys, values = self._gradient_checkpointing_func(run, x, *prefix)
        if ctx.persist:  # encoder mode: the one write of this pass
            cache.keys[i], cache.values[i] = keys, values
        return out

    def encode(
        self,
        embeds: torch.Tensor,
        cache: BlockDiffusionCache,
        layer_scalars: list[torch.Tensor],
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        backend: str = "sdpa",
        collect: list | None = None,
        vision_groups: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encoder mode: embeds [B, T, H] at slots [S, S+T), causal; writes the cache and advances it by T.

        Args:
            layer_scalars: the encoder-mode `layer_scalar` of every layer (a separate checkpoint buffer, spec B.2).
            keep: [B, >= S+T] bool, False for padding slots; None for no padding.
            positions: RoPE positions [B or 1, T]; defaults to the slots (left padding not compensated, spec C.10).
            vision_groups: [B, T] image of each token (-1 text): tokens of one image see each other (spec C.4).
        Returns:
            post-norm hidden states [B, T, H].
        """
        B, T, _ = embeds.shape
        S = cache.length
        if positions is None:
            positions = torch.arange(S, S + T, device=embeds.device)[None]
        masks = build_encoder_masks(self.type_shapes, S, T, keep, self.causal_encoder, B, embeds.device, backend,
                                    vision_groups)
        ctx = PassContext(self._rope(positions, embeds.dtype), masks, cache, True, backend)
        hidden = self._run(embeds, ctx, layer_scalars, collect)
        cache.advance(T)
        return hidden

    def soft_embedding(self, self_conditioning_logits: torch.Tensor, round_to: torch.dtype | None = None
                       ) -> torch.Tensor:
        """[B, L, V] logits -> [B, L, H]: softmax in fp32, cast to the embedding dtype, times Emb * sqrt(H) (C.9).

        Args:
            round_to: round the logits to this dtype before the softmax; `generate` passes the embedding dtype, as the
                reference's generate casts the previous step's logits (spec C.9).

        Without autograd the softmax runs in row blocks into one [B, L, V] buffer of the embedding dtype, so no fp32
        copy of the whole logits and no whole fp32 softmax are ever alive; the matmul still takes the whole buffer, so
        the result is bit-identical to the one-shot computation.
        """
        dtype = self.embed_tokens.weight.dtype
        if torch.is_grad_enabled():  # training: the one-shot form, differentiable
            logits = self_conditioning_logits if round_to is None else self_conditioning_logits.to(round_to)
            return self.embed_tokens.soft(logits.softmax(dim=-1, dtype=torch.float32))
        V = self_conditioning_logits.shape[-1]
        flat = self_conditioning_logits.reshape(-1, V)  # [B*L, V]
        probs = torch.empty(flat.shape, dtype=dtype, device=flat.device)  # [B*L, V] embedding dtype
        rows = max(1, (4 << 20) // (4 * V))  # ~4 MB of fp32 per block
        for start in range(0, flat.shape[0], rows):
            block = flat[start : start + rows]
            block = block if round_to is None else block.to(round_to)
            probs[start : start + rows] = block.softmax(dim=-1, dtype=torch.float32)  # cast to the embedding dtype
        return self.embed_tokens.soft(probs.view(self_conditioning_logits.shape))

    def denoise(
        self,
        canvas: torch.Tensor,
        cache: BlockDiffusionCache | StaticCacheView,
        soft_embeddings: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        backend: str = "sdpa",
        collect: list | None = None,
        masks: dict | None = None,
    ) -> torch.Tensor:
        """Decoder mode: canvas ids [B, L] at slots [S, S+L), bidirectional, reads the cache without committing.

        Args:
            cache: a `BlockDiffusionCache` (keys viewed as [kv_start, S+L), sized on the host: the exact path) or its
                `static_view()` (keys over the whole capacity [0, C), masked from S on the device: fixed shapes).
            soft_embeddings: self-conditioning input [B, L, H] (see `soft_embedding`), or None on the first step.
            keep: [B, >= S] bool padding vector over the cached slots; None for no padding. Exact path: where it has
                padding is read to the host once per vector and remembered on the cache (`PaddingSlots`), so the
                passes of a generate call after the first make no host sync. Static path: always a mask, no read.
            masks: finished masks per layer type for an exact-path pass, instead of the ones built here (training's
                multi-canvas pass, `masks.build_canvas_training_masks`, where `canvas` holds K canvases end to end
                and `positions` must be given); `keep` is then unused.
        Returns:
            post-norm hidden states [B, L, H].
        """
        B, L = canvas.shape
        S = cache.length  # host int, or [] device tensor for a static view
        if positions is None:
            if isinstance(S, torch.Tensor) and S.dim() == 1:  # a static view of `RowCache` rows: S_b per row
                positions = S[:, None] + torch.arange(L, device=canvas.device)  # [B, L]
            else:
                positions = (S + torch.arange(L, device=canvas.device))[None]  # [1, L]
        x = self.self_conditioning(self.embed_tokens(canvas), soft_embeddings)  # [B, L, H]
        if masks is not None:
            if isinstance(cache, StaticCacheView):
                raise ValueError("explicit `masks` are for the exact path (a BlockDiffusionCache), not a static view")
        elif isinstance(cache, StaticCacheView):
            masks = build_static_decoder_masks(self.type_shapes, S, L, cache.capacity, keep, B, canvas.device, backend,
                                               self.decoder_window)  # [B, 1, L, C] per layer type
        else:
            padding = None
            if keep is not None:
                padding = cache.padding = PaddingSlots.of(keep, getattr(cache, "padding", None))
            masks = build_decoder_masks(self.type_shapes, S, L, padding, B, canvas.device, backend,
                                        self.decoder_window)
        ctx = PassContext(self._rope(positions, x.dtype), masks, cache, False, backend)
        scalars = [layer.layer_scalar for layer in self.layers]
        return self._run(x, ctx, scalars, collect)

    def run_rows(
        self,
        tokens: torch.Tensor,
        cache: RowCache,
        q_lens: list[int],
        encoder_rows: list[bool],
        encoder_scalars: list[torch.Tensor],
        soft_embeddings: torch.Tensor | None = None,
        soft_rows: list[int] | None = None,
        canvas_length: int = 0,
        backend: str = "sdpa",
        images=None,
    ) -> torch.Tensor:
        """One mixed-phase pass: every row is an encoder row (prefill or commit: causal, its tokens get committed) or
        a denoising row (bidirectional canvas with self-conditioning, reads its prefix); all share one forward.

        The row bookkeeping comes from the host (the scheduler knows it), so the pass makes no host sync.

        Args:
            tokens: [n, T] ids per row, left-aligned; row b's first q_lens[b] are real, the rest padding.
            cache: the `RowCache`; rows [0, n) take part. Encoder rows' committed lengths advance by q_lens.
            q_lens: n ints, real tokens per row.
            encoder_rows: n bools.
            encoder_scalars: the encoder-mode `layer_scalar` of every layer (decoder rows use the layer's own).
            soft_embeddings: [m, L, H] self-conditioning input of the denoising rows `soft_rows` (m row indices; the
                other denoising rows are on their first step and have none).
            canvas_length: L, the denoising rows' real tokens (self-conditioning applies to those).
            images: a `vision.PromptImages` over [n, T] for the prefill rows' image soft tokens, or None.
        Returns:
            post-norm hidden states [n, T, H].
        """
        n, T = tokens.shape
        device, L = tokens.device, canvas_length
        soft_rows = list(soft_rows) if soft_rows is not None else []
        first_start, last_start = min(cache.lengths[:n]), max(cache.lengths[:n])
        starts = cache.begin(n, T)  # [n] S_b on the device
        x = scatter_images(self.embed_tokens(tokens), images)  # [n, T, H]
        first_step = [b for b in range(n) if not encoder_rows[b] and b not in soft_rows]
        if first_step:  # denoising rows without a self-conditioning input yet
            rows = device_tensor(first_step, torch.long, device)
            x[rows, :L] = self.self_conditioning(x[rows, :L], None)
        if soft_rows:
            rows = device_tensor(soft_rows, torch.long, device)
            x[rows, :L] = self.self_conditioning(x[rows, :L], soft_embeddings)
        positions = starts[:, None] + torch.arange(T, device=device)  # [n, T]
        encoder = device_tensor(encoder_rows, torch.bool, device)  # [n]
        masks = build_row_masks(self.type_shapes, starts, (first_start, last_start),
                                device_tensor(q_lens, torch.long, device), encoder, T, self.causal_encoder, device,
                                backend, images.groups if images is not None else None, self.decoder_window)
        ctx = PassContext(self._rope(positions, x.dtype), masks, cache, False, backend)
        pick = encoder[:, None, None]
        scalars = [torch.where(pick, enc, layer.layer_scalar) for enc, layer in zip(encoder_scalars, self.layers)]
        hidden = self._run(x, ctx, scalars, None)
        cache.advance([q if e else 0 for q, e in zip(q_lens, encoder_rows)])
        return hidden
