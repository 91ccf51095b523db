"""Our model inside diffusers' `DiffusionGemmaPipeline`: thin views of our one stack for the three things the
pipeline reaches for, with no second copy of any weight.

    model.model.encoder(input_ids=, attention_mask=, past_key_values=, position_ids=, pixel_values=, ...)
        -> `model.encode` (encoder mode of our stack) into our `BlockDiffusionCache`
    model.model.decoder.create_diffusion_decoder_attention_mask(config=, inputs_embeds=, past_key_values=,
                                                                 decoder_attention_mask=)
        -> `PipelineDecoderMask`, the padding mask [B, S + L] as our `forward` takes it
    model(decoder_input_ids=, past_key_values=, self_conditioning_logits=, decoder_attention_mask=<that mask>,
          decoder_position_ids=)
        -> our `forward` over our cache (`pipeline_forward_inputs`, the one hook in the class)

The pipeline builds a transformers `DynamicCache` or `StaticCache` itself and never writes into it: our cache rides
on that object (`our_cache`), whose `get_seq_length` then reports our committed length, so the pipeline encodes
only the tokens not yet cached (the prompt, then each committed canvas). Which sequences come out is the pipeline's
and its scheduler's business; tests/test_diffusers_pipeline.py checks they equal the pipeline's with transformers'
built-in class.

Legend: B batch, S cached slots, T new tokens, L canvas length, H hidden.
"""

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import BaseModelOutputWithPast

from .modeling.cache import BlockDiffusionCache
from .modeling.vision import prompt_images

CACHE_ATTRIBUTE = "_diffusiongemma_cache"


class PipelineStaticCache(BlockDiffusionCache):
    """Our cache with attention's keys laid out as transformers' `StaticCache` lays them out for the built-in class.

    The built-in attends over the whole static buffer of each layer: `max_cache_len` slots in encoder passes, that
    plus the canvas in denoising passes, the unwritten slots zero and masked. The hidden slots change nothing
    mathematically, but they change how SDPA blocks its reduction, so in bf16 the rounding (and then the sampled
    tokens) differs from the exact view. This cache hands attention the same zero-padded buffer (the attention layer
    widens the mask to hide the padding, `masks.widen_mask`), so the pipeline gives the built-in's sequences bit for
    bit with "static" too. Used only when no sliding window is shorter than the static cache: the built-in's static
    sliding layers keep W slots where the reference keeps W - 1 (spec C.10), a difference of meaning, so with a
    shorter window `our_cache` keeps a plain cache and the run is the reference's dynamic one from the first pass.

    Args:
        shapes: the stack's layer shapes.
        buffer_slots: per layer, the slots of the pipeline's `StaticCache` layer (`get_max_length()`).
    """

    def __init__(self, shapes, buffer_slots: list[int]):
        super().__init__(shapes)
        self.buffer_slots = list(buffer_slots)
        self.padded_prompt = False  # set by the encoder view before the first pass

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool):
        keys, values = super().write(layer, key, value, kv_start, persist)  # [B, K, S + T - kv_start, D]
        if persist and self.length == 0 and not self.padded_prompt:
            return keys, values  # transformers' first prefill of an unpadded prompt: keys cut to the prompt, causal
        total = self.buffer_slots[layer] + (0 if persist else key.shape[2])  # the built-in's key length
        if kv_start or total <= keys.shape[2]:
            return keys, values
        B, K, _, D = keys.shape
        pad = keys.new_zeros(B, K, total - keys.shape[2], D)
        return torch.cat([keys, pad], dim=2), torch.cat([values, pad.to(values.dtype)], dim=2)


def our_cache(model, cache) -> BlockDiffusionCache:
    """The `BlockDiffusionCache` riding on a pipeline's transformers cache (made on first use; for a `StaticCache`
    a `PipelineStaticCache` reserved to its length, or a plain one on the flex backend, which takes no dense mask)."""
    ours = getattr(cache, CACHE_ATTRIBUTE, None)
    if ours is None:
        ours = model.new_cache()
        capacity = cache.get_max_length() if getattr(cache, "is_compileable", False) else None  # StaticCache
        if isinstance(capacity, int) and capacity > 0:  # reserve what it holds
            layers = getattr(cache, "layers", [])
            slots = [layer.get_max_length() for layer in layers]
            if len(layers) == len(ours.shapes) and model.attention_backend != "flex" and min(slots) >= capacity:
                ours = PipelineStaticCache(ours.shapes, slots)
            # else a sliding window shorter than the static cache: the window fills during the run, where the
            # built-in's static run means something else (W slots, not W - 1); ours then runs exactly as with the
            # dynamic cache, from the first pass, so its sequences are the reference's dynamic run's
            ours.reserve(capacity)
        setattr(cache, CACHE_ATTRIBUTE, ours)
        cache.get_seq_length = lambda layer_idx=0: ours.length  # what the pipeline reads to slice its input
    return ours


@dataclass(frozen=True)
class PipelineDecoderMask:
    """What `create_diffusion_decoder_attention_mask` returns: the pipeline's padding mask over cache + canvas."""

    decoder_attention_mask: torch.Tensor  # [B, S + L] bool, True on the canvas


class EncoderView:
    """`model.model.encoder(...)` as the pipeline calls it: one encoder-mode pass of our stack over the new tokens
    input_ids [B, T], written into our cache. Returns `BaseModelOutputWithPast` (post-norm hidden [B, T, H])."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, past_key_values=None,
                 position_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None,
                 image_position_ids: torch.Tensor | None = None, mm_token_type_ids: torch.Tensor | None = None,
                 **kwargs) -> BaseModelOutputWithPast:
        if kwargs:
            raise TypeError(f"model.model.encoder() got unexpected keyword arguments: {sorted(kwargs)}")
        if past_key_values is None:
            raise ValueError("model.model.encoder() writes into `past_key_values` (a transformers cache, as "
                             "diffusers' DiffusionGemmaPipeline passes); call `model.encode` for our own cache")
        cache = our_cache(self.model, past_key_values)
        B, T = input_ids.shape
        keep = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, cache.length + T):
                raise ValueError(f"`attention_mask` must cover the cached and the new tokens, [{B}, "
                                 f"{cache.length + T}], got {list(attention_mask.shape)}")
            keep = attention_mask.bool()
        if isinstance(cache, PipelineStaticCache) and cache.length == 0:
            cache.padded_prompt = keep is not None and not bool(keep.all())
        images = prompt_images(self.model, input_ids, pixel_values=pixel_values,
                               image_position_ids=image_position_ids, mm_token_type_ids=mm_token_type_ids,
                               mm_encoder_outputs=None)
        hidden = self.model.encode(input_ids, cache, keep=keep, positions=position_ids, images=images)
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values)


class DecoderMaskView:
    """`model.model.decoder.create_diffusion_decoder_attention_mask(...)`: our decoder builds its masks itself (from
    the padding, `modeling/masks.py`), so this only hands the padding on to `forward`."""

    def __call__(self, config=None, inputs_embeds=None, past_key_values=None,
                 decoder_attention_mask: torch.Tensor | None = None, **kwargs) -> PipelineDecoderMask | None:
        if decoder_attention_mask is None:
            return None
        return PipelineDecoderMask(decoder_attention_mask.bool())


def attach_diffusers_views(model) -> None:
    """Give `model.model.encoder` a call and `model.model.decoder` the mask builder the pipeline uses. Both are plain
    attributes (no module, no parameter), so checkpoints, `state_dict` and devices are unchanged."""
    model.model.encoder.forward = EncoderView(model)
    model.model.decoder.create_diffusion_decoder_attention_mask = DecoderMaskView()


def pipeline_forward_inputs(model, past_key_values, decoder_attention_mask):
    """`forward`'s view of the pipeline's arguments: (our cache, the padding mask tensor or None).

    Raises:
        TypeError: `past_key_values` is neither our cache nor a transformers cache our encoder view filled.
    """
    ours = getattr(past_key_values, CACHE_ATTRIBUTE, None)
    if ours is None:
        raise TypeError("`past_key_values` must be a diffusiongemma BlockDiffusionCache (from `model.new_cache()` or "
                        "an earlier output), or a transformers cache that `model.model.encoder(...)` filled (as in "
                        f"diffusers' DiffusionGemmaPipeline), got {type(past_key_values).__name__}")
    if isinstance(decoder_attention_mask, PipelineDecoderMask):
        decoder_attention_mask = decoder_attention_mask.decoder_attention_mask
    return ours, decoder_attention_mask
