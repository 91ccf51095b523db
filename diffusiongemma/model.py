"""`DiffusionGemmaForBlockDiffusion`: the transformers-facing model (spec B, C.8, C.12).

It joins the network (`modeling/`) with `generate` (`generation/`), the training loss (`training/`) and loading
(`loading/`), as transformers joins `PreTrainedModel` and `GenerationMixin`; nothing below imports it.

Module paths mirror the checkpoint so weights load and save without renaming (spec B.1/B.2):

    model.decoder.*                         the one text stack (`DiffusionGemmaTextStack`), both modes
    model.encoder.language_model.layers.i   only the encoder-mode `layer_scalar` buffers
    model.encoder.vision_tower / embed_vision
    lm_head                                  tied to model.decoder.embed_tokens

Legend: B batch, P prompt tokens, L canvas length, S cached slots, H hidden, V vocab.
"""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init

from .diffusers_views import attach_diffusers_views, pipeline_forward_inputs
from .generation.loop import generate
from .generation_config import DiffusionGemmaGenerationConfig
from .loading import PipelineLoadError, generation_config_for, load_pretrained, save_atomically
from .modeling.blocks import RMSNorm
from .modeling.cache import BlockDiffusionCache
from .modeling.config import DiffusionGemmaConfig, check_config
from .modeling.moe import Experts, Router
from .modeling.parallel import add_stack_plans
from .modeling.parts import DiffusionGemmaModel, DiffusionGemmaOutput
from .modeling.stack import DiffusionGemmaTextStack
from .modeling.validation import attention_backend_for, check_experts_implementation, check_forward_inputs
from .modeling.vision import (PromptImages, check_no_audio_or_video, project_images, prompt_images,
                              scatter_images)
from .training.loss import block_diffusion_loss

__all__ = ["DiffusionGemmaForBlockDiffusion", "DiffusionGemmaOutput", "DiffusionGemmaPreTrainedModel",
           "PipelineLoadError"]


class DiffusionGemmaPreTrainedModel(PreTrainedModel):
    config_class = DiffusionGemmaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DiffusionGemmaLayer", "Gemma4VisionEncoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = False

    def _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs) -> str:
        """transformers' check (at construction, `from_pretrained` and `set_attn_implementation`), preceded by ours:
        an implementation our attention cannot run is a ValueError here, not a silent fallback at forward."""
        attention_backend_for(attn_implementation)
        return super()._check_and_adjust_attn_implementation(attn_implementation, *args, **kwargs)

    def _check_and_adjust_experts_implementation(self, experts_implementation, *args, **kwargs) -> str | None:
        """Accept None, "grouped_mm" and "eager" (our MoE computes what the built-in does under either) and record the
        value unchanged: transformers' own check would turn "grouped_mm" into an error (our classes do not use its
        experts decorator) and None into "eager", which, on a config shared with the built-in class, would switch the
        built-in off its default grouped_mm."""
        check_experts_implementation(experts_implementation)
        return experts_implementation

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.get_text_config().initializer_range
        if isinstance(module, Router):
            init.ones_(module.scale)
            init.ones_(module.per_expert_scale)
        elif isinstance(module, Experts):
            init.normal_(module.gate_up_proj, mean=0.0, std=std)
            init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, RMSNorm) and module.weight is not None:
            init.ones_(module.weight)
        if isinstance(getattr(module, "layer_scalar", None), torch.Tensor):
            init.ones_(module.layer_scalar)


class DiffusionGemmaForBlockDiffusion(DiffusionGemmaPreTrainedModel):
    """DiffusionGemma for block-autoregressive discrete diffusion.

    `forward` runs an optional encoder pass (prompt -> cache) and one denoising pass over a canvas; `generate` runs the
    whole block-diffusion loop (spec D). Loads any checkpoint of `google/diffusiongemma-26B-A4B-it` or written by
    transformers' built-in class, and saves the same layout back.
    """

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    generation_config_class = DiffusionGemmaGenerationConfig
    accepts_loss_kwargs = False  # the loss normalizes itself; Trainer must not pass `num_items_in_batch`

    def __init__(self, config: DiffusionGemmaConfig):
        check_config(config)  # every field named before any weight is built (modeling/config.py)
        super().__init__(config)
        text = config.text_config
        self.model = DiffusionGemmaModel(config)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.post_init()
        attach_diffusers_views(self)  # what diffusers' DiffusionGemmaPipeline calls (diffusers_views.py)

    def init_parallel_plans(self) -> None:
        """transformers' plans plus the text stack's under our module paths (`modeling/parallel.py`)."""
        super().init_parallel_plans()
        add_stack_plans(self)

    def get_decoder(self) -> DiffusionGemmaTextStack:
        """The one text stack (`model.decoder`), which runs both modes: encoder (causal, writes the cache) and decoder
        (bidirectional over the canvas, reads it).

        Overrides transformers' `PreTrainedModel.get_decoder`, whose lookup would return this model itself (our
        `model` container is not a `PreTrainedModel`). The built-in class resolves to the module at the same path,
        `model.decoder`.
        """
        return self.model.decoder

    @property
    def canvas_length(self) -> int:
        return int(self.config.canvas_length)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.get_decoder().embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.get_decoder().embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @property
    def attention_backend(self) -> str:
        """Our backend ("eager", "sdpa" or "flex") for `config._attn_implementation`; anything else is a ValueError."""
        return attention_backend_for(getattr(self.config, "_attn_implementation", None))

    def new_cache(self, capacity: int = 0) -> BlockDiffusionCache:
        """An empty KV cache for `forward(..., past_key_values=...)` or `generate`, with `capacity` static slots per
        layer (0: sized by `reserve` or by the first write; see modeling/cache.py)."""
        return self.get_decoder().new_cache(capacity)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden [B, L, H] -> logits [B, L, V] fp32, soft-capped in fp32 (spec C.8)."""
        logits = self.lm_head(hidden).float()
        cap = self.config.text_config.final_logit_softcapping
        if cap is not None and torch.is_grad_enabled():
            logits = torch.tanh(logits / cap) * cap
        elif cap is not None:
            logits = logits.div_(cap).tanh_().mul_(cap)  # same ops in place: no extra [B, L, V] buffers
        return logits

    def encode(
        self,
        input_ids: torch.Tensor,
        cache: BlockDiffusionCache,
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        collect: list | None = None,
        images: PromptImages | None = None,
    ) -> torch.Tensor:
        """Encoder pass over input_ids [B, T]: writes T slots to `cache`; returns post-norm hidden [B, T, H].

        `images` (from `vision.prompt_images`) writes image soft tokens over the placeholders and, with
        `use_bidirectional_attention == "vision"`, lets each image's tokens see each other (spec C.11, C.4)."""
        stack = self.get_decoder()
        return stack.encode(
            scatter_images(stack.embed_tokens(input_ids), images),
            cache,
            self.model.encoder.layer_scalars(),
            keep=keep,
            positions=positions,
            backend=self.attention_backend,
            collect=collect,
            vision_groups=images.groups if images is not None else None,
        )

    def get_image_features(self, pixel_values: torch.Tensor, image_position_ids: torch.Tensor):
        """Images -> soft tokens, as the built-in class's method of this name: pixel_values [I, M, 3*p*p] and
        image_position_ids [I, M, 2] (Gemma 4 processor) -> `BaseModelOutputWithPooling` with `last_hidden_state`
        [K, Hv] (vision tower) and `pooler_output` [K, H] (projected). Pass `{"image": output}` as
        `mm_encoder_outputs` to `forward`/`generate` to reuse them."""
        return project_images(self.model.encoder, pixel_values, image_position_ids)

    def denoise(
        self,
        canvas: torch.Tensor,
        cache: BlockDiffusionCache,
        soft_embeddings: torch.Tensor | None = None,
        keep: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        collect: list | None = None,
    ) -> torch.Tensor:
        """Decoder pass over canvas [B, L] reading `cache`; returns post-norm hidden [B, L, H] (no LM head)."""
        return self.get_decoder().denoise(
            canvas, cache, soft_embeddings, keep=keep, positions=positions, backend=self.attention_backend,
            collect=collect,
        )

    def run_rows(
        self,
        tokens: torch.Tensor,
        cache,
        q_lens: list[int],
        encoder_rows: list[bool],
        soft_embeddings: torch.Tensor | None = None,
        soft_rows: list[int] | None = None,
        images: PromptImages | None = None,
    ) -> torch.Tensor:
        """Mixed-phase pass over a `RowCache` (see `DiffusionGemmaTextStack.run_rows`): tokens [n, T] -> post-norm
        hidden [n, T, H]; encoder rows commit, denoising rows `soft_rows` get soft_embeddings [m, L, H], prefill rows
        their `images` ([n, T] placeholders). The row bookkeeping (q_lens, encoder_rows, soft_rows) is host lists, so
        the pass makes no host sync."""
        return self.get_decoder().run_rows(
            tokens, cache, q_lens, encoder_rows, self.model.encoder.layer_scalars(), soft_embeddings, soft_rows,
            canvas_length=self.canvas_length, backend=self.attention_backend, images=images,
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: BlockDiffusionCache | None = None,
        position_ids: torch.LongTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        self_conditioning_logits: torch.Tensor | None = None,
        self_conditioning_mask: torch.BoolTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        labels_canvas_length: int | torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        image_position_ids: torch.LongTensor | None = None,
        mm_token_type_ids: torch.LongTensor | None = None,
        mm_encoder_outputs: dict | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> DiffusionGemmaOutput:
        """Optional encoder pass, then one denoising pass (spec C.12).

        Args:
            input_ids: [B, P] uncached prompt tokens; encoded into `past_key_values` (a new cache if None).
            attention_mask: [B, P] or [B, S+P], 1 for real tokens, 0 for (left) padding.
            past_key_values: a `BlockDiffusionCache` from an earlier call; required when `input_ids` is None.
            position_ids: [1 or B, P] encoder positions; default: the cache slots.
            decoder_input_ids: [B, L] canvas; default: uniform random tokens of length `config.canvas_length`.
            self_conditioning_logits: [B, L, V] previous-step logits; None on the first step.
            self_conditioning_mask: [B] bool; False rows get no self-conditioning.
            decoder_attention_mask: [B, S] or [B, S+L] padding over the cache (canvas part must be 1). As in the
                reference, the decoder only masks padding when this is given.
            decoder_position_ids: [1 or B, L]; default: slots S..S+L-1.
            labels: [B, L] clean canvas for the training loss, or [B, K*L] for K canvases (see
                `diffusiongemma.training`); `config.ar_loss_weight` (default 1.0) weighs its AR prefix loss.
            labels_canvas_length: the canvas length `labels` were laid out for (`DiffusionGemmaDataCollator` puts it
                in every batch, as a 0-d tensor); another value than `config.canvas_length` is a ValueError naming
                both.
            pixel_values: [I, M, 3*p*p] images from the Gemma 4 processor, encoded once into the placeholders of
                `input_ids` (`config.image_token_id`); image_position_ids: [I, M, 2] their patch positions.
            mm_token_type_ids: [B, P] 1 at image tokens: with `use_bidirectional_attention == "vision"` each image's
                tokens see each other in the encoder pass (as the built-in `generate` does; its `forward` drops this
                overlay, spec H.17).
            mm_encoder_outputs: `{"image": model.get_image_features(...)}` instead of `pixel_values`.
            output_hidden_states: also return the decoder-mode hidden state after every layer.
            return_dict: False returns `.to_tuple()` of the output (its non-None fields, logits first), as
                transformers models do; default `config.return_dict`.
            use_cache: accepted for transformers compatibility; the encoder pass always writes the cache and the
                decoder pass never does (spec C.12), so it changes nothing.
        Returns:
            `DiffusionGemmaOutput` with `logits` [B, L, V] fp32 (or `BlockDiffusionLossOutput` with `labels`).
        """
        check_no_audio_or_video(kwargs)
        if kwargs:
            raise TypeError(f"forward() got unexpected keyword arguments: {sorted(kwargs)}")
        if past_key_values is not None and not isinstance(past_key_values, BlockDiffusionCache):
            # diffusers' pipeline: its transformers cache carries ours (diffusers_views.py)
            past_key_values, decoder_attention_mask = pipeline_forward_inputs(self, past_key_values,
                                                                              decoder_attention_mask)
        vision = dict(pixel_values=pixel_values, image_position_ids=image_position_ids,
                      mm_token_type_ids=mm_token_type_ids, mm_encoder_outputs=mm_encoder_outputs)
        if input_ids is None and any(v is not None for v in vision.values()):
            raise ValueError(f"image inputs {sorted(k for k, v in vision.items() if v is not None)} need `input_ids` "
                             "(images enter through the encoder pass over the prompt)")
        if labels is not None and any(v is not None for v in vision.values()):
            raise ValueError("the training loss (`labels`) takes text prompts only; drop the image inputs")
        if return_dict is None:
            return_dict = self.config.return_dict
        if labels_canvas_length is not None and int(labels_canvas_length) != self.config.canvas_length:
            raise ValueError(f"the batch was laid out for canvas_length={int(labels_canvas_length)} (the data "
                             f"collator's), but the model's config.canvas_length is {self.config.canvas_length}: build "
                             "the collator with model=model")
        if labels is not None:
            loss = block_diffusion_loss(
                self, input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                self_conditioning_mask=self_conditioning_mask, ar_weight=getattr(self.config, "ar_loss_weight", 1.0),
            )
            return loss if return_dict else loss.to_tuple()
        text = self.config.text_config
        inputs = check_forward_inputs(
            vocab_size=text.vocab_size,
            max_positions=text.max_position_embeddings,
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            decoder_input_ids=decoder_input_ids,
            self_conditioning_logits=self_conditioning_logits,
            self_conditioning_mask=self_conditioning_mask,
            decoder_attention_mask=decoder_attention_mask,
            canvas_length=self.canvas_length,
        )
        cache = past_key_values if past_key_values is not None else self.new_cache()
        encoder_hidden = None
        if input_ids is not None:
            images = prompt_images(self, input_ids, **vision)
            encoder_hidden = self.encode(input_ids, cache, keep=inputs.encoder_keep, positions=position_ids,
                                         images=images)
        canvas = decoder_input_ids
        if canvas is None:
            # spec C.12: a missing canvas is drawn uniformly from the global RNG
            canvas = torch.randint(0, text.vocab_size, (inputs.batch, self.canvas_length), device=self.device)
        soft = None
        if self_conditioning_logits is not None:
            soft = self.get_decoder().soft_embedding(self_conditioning_logits)  # [B, L, H]
            if self_conditioning_mask is not None:
                soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
        collect = [] if output_hidden_states else None
        hidden = self.denoise(
            canvas, cache, soft, keep=inputs.decoder_keep, positions=decoder_position_ids, collect=collect
        )
        out = DiffusionGemmaOutput(
            logits=self.head(hidden),
            past_key_values=cache,
            hidden_states=tuple(collect) if collect is not None else None,
            encoder_last_hidden_state=encoder_hidden,
        )
        return out if return_dict else out.to_tuple()  # like transformers' `can_return_tuple`: the non-None fields

    def generate(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config=None,
        streamer=None,
        logits_processor=None,
        stopping_criteria=None,
        past_key_values: BlockDiffusionCache | None = None,
        sampling: str | None = None,
        seed: int | list[int] | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        batching: str | None = None,
        max_batch_size: int | None = None,
        compile: bool | dict = False,
        batch_invariant: bool = False,
        return_trace: bool = False,
        trace_top_k: int = 8,
        trace_sc_embedding: bool = False,
        constraint=None,
        tokenizer=None,
        **kwargs,
    ):
        """Block-autoregressive denoising (spec D). Every argument is documented at
        `diffusiongemma.generation.loop.generate`; `**kwargs` are generation config fields (`max_new_tokens`,
        `max_denoising_steps`, `t_min`, ...), `decoder_input_ids`, `self_conditioning_logits` and the image inputs."""
        return generate(
            self, input_ids, attention_mask=attention_mask, generation_config=generation_config, streamer=streamer,
            logits_processor=logits_processor, stopping_criteria=stopping_criteria, past_key_values=past_key_values,
            sampling=sampling, seed=seed, generator=generator, batching=batching, max_batch_size=max_batch_size,
            compile=compile, batch_invariant=batch_invariant, return_trace=return_trace, trace_top_k=trace_top_k,
            trace_sc_embedding=trace_sc_embedding, constraint=constraint, tokenizer=tokenizer, **kwargs,
        )

    @classmethod
    def can_generate(cls) -> bool:
        return True

    def adjust_generation_fn(self, generation_config=None, from_auto_class=False, from_pipeline=None,
                             pretrained_model_name_or_path=None, **repo_kwargs) -> None:
        """Called by `from_pretrained`: read `generation_config.json` into our generation config class."""
        config = generation_config_for(generation_config, pretrained_model_name_or_path, **repo_kwargs)
        if config is not None:
            self.generation_config = config

    def save_pretrained(self, save_directory, *args, overwrite: bool = True, **kwargs) -> None:
        """transformers' `save_pretrained`, written atomically (`diffusiongemma.io.atomic_folder`): into a temporary
        sibling first, then swapped into place, so an interrupted save leaves the previous checkpoint complete, and no
        stale weight file of the previous checkpoint survives (files that are not part of a checkpoint, such as a
        tokenizer, are kept).

        Args:
            overwrite: replace a folder that already holds a checkpoint (True, as transformers does: training loops
                re-save into the same folder); False refuses it with a FileExistsError.
        Raises:
            NotADirectoryError: `save_directory` is a file (transformers would only log and return).
        """
        save_atomically(super().save_pretrained, save_directory, *args, overwrite=overwrite, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, strict: bool = True, **kwargs):
        """transformers' `from_pretrained` (dtype, device_map, sharded safetensors, quantization_config, ...), plus:

        * checkpoints with the text weights under `model.encoder.language_model.*` are renamed on the fly;
        * `strict=True` (default): missing, mis-shaped or unexpected weights raise a ValueError naming the keys
          instead of being silently initialized at random;
        * compressed-tensors FP8 / NVFP4 checkpoints load compressed (`diffusiongemma.loading`), also
          through `AutoModelForCausalLM` and `pipeline("text-generation", model=path)`.

        Raises:
            PipelineLoadError: loading failed under `pipeline(...)`, which would otherwise retry with transformers'
                built-in class (and, for a compressed-tensors checkpoint, random weights).
        """
        return load_pretrained(cls, super().from_pretrained, pretrained_model_name_or_path, *model_args,
                               strict=strict, **kwargs)
