"""Resolve and validate every argument of `generate` once, at the top (spec D.1-D.3): nothing below reads `**kwargs`.

The result is one frozen `GenerationRun`; the loops read only it.

Legend: B batch, P prompt, L canvas length, S cached slots, V vocab, H hidden.
"""

import math
import numbers
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.utils import logging

from ..constraints import TokenAutomaton, as_constraint, compile_constraint
from ..modeling.cache import BlockDiffusionCache
from ..modeling.validation import check_left_padding, check_token_ids, padding_vector
from ..modeling.vision import (VISION_INPUTS, PromptImages, check_no_audio_or_video, prompt_images,
                               warn_if_images_missing)
from .config import DiffusionGemmaGenerationConfig, resolve_generation_config
from .options import RunOptions, run_options
from .sampler import Sampler, SamplerContext, row_generators, sampler_class_for, sampler_names

MODEL_KWARGS = ("decoder_input_ids", "self_conditioning_logits", *VISION_INPUTS)
# Autoregressive sampling knobs that generic callers (the text-generation pipeline adds do_sample=True and
# temperature=0.7 by default) pass along. Block diffusion always samples, with its own temperature schedule.
AR_SAMPLING_KWARGS = ("do_sample", "temperature")

logger = logging.get_logger(__name__)


def check_ar_sampling_kwargs(rest: dict) -> None:
    """do_sample=False is an error (there is no greedy block diffusion); temperature is superseded by t_min/t_max."""
    if rest.get("do_sample") is False:
        raise ValueError("`do_sample=False` is not supported: block diffusion always samples; lower `t_min`/`t_max` "
                         "for more deterministic output")
    if rest.get("temperature") is not None:
        logger.warning_once(
            "`temperature` is not used by block diffusion, which follows its own linear schedule from `t_max` to "
            "`t_min`; pass those instead."
        )


def generated_length(config, cur_len: int, explicit: set) -> tuple[int, int]:
    """(max_length, max_new_tokens) as the reference resolves them (spec D.2, pitfall H.11)."""
    if {"max_length", "max_new_tokens"} <= explicit:
        raise ValueError("Pass only one of `max_length` and `max_new_tokens`")
    if config.max_length and config.max_new_tokens == 256 and "max_new_tokens" not in explicit:
        max_new_tokens = config.max_length - cur_len
        if max_new_tokens <= 0:
            raise ValueError(f"`max_length` ({config.max_length}) must exceed the prompt length ({cur_len})")
        return config.max_length, max_new_tokens
    return config.max_new_tokens + cur_len, config.max_new_tokens


# torch.Generator.manual_seed takes 64 bits, but the CPU generator (mt19937) keeps only the low 32: seeds s and
# s + 2**32 would give the same draws. One bound on every device keeps a seed meaning the same thing everywhere.
SEED_MAX = 2**32 - 1


def check_seed(seed, batch: int) -> None:
    """seed: None, a non-negative int (row b uses seed + b) or a list of `batch` such ints; anything else (a string,
    a float that would be truncated, a bool, a value beyond 64 bits) is refused, naming the value."""
    if seed is None:
        return
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    for s in seeds:
        if not isinstance(s, numbers.Integral) or isinstance(s, bool):
            raise TypeError(f"`seed` must be an int or a list of ints, got {s!r} ({type(s).__name__})")
    top = max(seeds) + (batch - 1 if not isinstance(seed, (list, tuple)) else 0) if seeds else 0
    if seeds and (min(seeds) < 0 or top > SEED_MAX):
        raise ValueError(f"`seed` must lie in [0, 2**32 - 1] (the CPU generator keeps 32 bits; for every row: an "
                         f"int seed gives row b seed + b), got {seed!r}")


def check_token_range(config, vocab_size: int) -> None:
    """pad_token_id is written into the output, so it must be a token of the vocabulary; so must every EOS id (one
    outside it could never be generated, and generation would never stop early)."""
    pad, eos = config.pad_token_id, config.eos_token_id
    if pad is not None and not pad < vocab_size:
        raise ValueError(f"`pad_token_id` ({pad}) is outside the vocabulary [0, {vocab_size})")
    for e in eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []:
        if not e < vocab_size:
            raise ValueError(f"`eos_token_id` {eos!r} holds {e}, outside the vocabulary [0, {vocab_size})")


@dataclass(frozen=True)
class GenerationRun:
    """Everything `generate` resolved from its arguments; read by the loops, never changed."""

    config: DiffusionGemmaGenerationConfig
    input_ids: torch.Tensor  # [B, P]
    attention_mask: torch.Tensor | None  # [B, S + P] as given
    keep: torch.Tensor | None  # [B, all slots] bool, None without padding
    cur_len: int  # S + P
    num_canvases: int
    sampling: str  # the registered sampling name (`sampler.sampling_names`)
    batching: str  # "mixed", "lockstep" or "chunks" (`options.mode` names batch-invariant and slices apart)
    max_batch_size: int | None
    generators: list | None  # fast mode: one per row
    sampler: Sampler
    processors: LogitsProcessorList | None
    user_criteria: StoppingCriteriaList | None
    eos_ids: torch.Tensor | None  # [E]
    decoder_input_ids: torch.Tensor | None  # [B, L]
    self_conditioning_logits: torch.Tensor | None  # [B, L, V]
    past_key_values: BlockDiffusionCache | None
    trace_top_k: int | None = None  # record a trace with this top-k width (None: no trace)
    trace_sc_embedding: bool = False  # the trace also keeps the exact self-conditioning input [B, L, H] per step
    images: PromptImages | None = None  # the prompt's image soft tokens, encoded once (modeling/vision.py)
    position_offsets: tuple[int, ...] = ()  # [B] each row's prompt length without its padding
    constraint: object = None  # the user's `Regex` / `JsonSchema`, or None
    tokenizer: object = None  # the tokenizer it was compiled over
    automaton: TokenAutomaton | None = None  # the compiled constraint (constraints/automaton.py)
    max_new_tokens: int = 0  # the resolved budget (the output holds num_canvases whole canvases)
    options: RunOptions | None = None  # the checked run options and the mode (options.py)

    @property
    def fast(self) -> bool:
        """The sampler draws per row (`Sampler.per_row`): rows skip work once stopped, mixed batching applies."""
        return self.sampler.per_row


def resolve_run(model, input_ids, attention_mask, generation_config, streamer, logits_processor, stopping_criteria,
                past_key_values, sampling, seed, generator, batching, max_batch_size, kwargs: dict,
                return_trace: bool = False, trace_top_k: int = 8, trace_sc_embedding: bool = False,
                constraint=None, tokenizer=None, compile=False, batch_invariant: bool = False) -> GenerationRun:
    """Validate every argument of `generate` (see there) and resolve them into one `GenerationRun`."""
    text = model.config.text_config
    V, L = text.vocab_size, model.canvas_length
    config, rest, explicit = resolve_generation_config(model.generation_config, generation_config, kwargs)
    check_ar_sampling_kwargs(rest)
    check_no_audio_or_video(rest)
    unknown = sorted(set(rest) - set(MODEL_KWARGS) - set(AR_SAMPLING_KWARGS))
    if unknown:
        raise ValueError(f"generate() got unknown keyword arguments {unknown}; expected generation config fields "
                         f"or one of {list(MODEL_KWARGS)}")
    if input_ids is None:
        raise ValueError("`input_ids` is required: pass the prompt as a [batch, length] tensor")
    check_token_ids("input_ids", input_ids, V)
    if past_key_values is not None and not isinstance(past_key_values, BlockDiffusionCache):
        raise TypeError("`past_key_values` must be a diffusiongemma BlockDiffusionCache (from `model.new_cache()` or "
                        f"an earlier output), got {type(past_key_values).__name__}")
    B, P = input_ids.shape
    device = input_ids.device
    cur_len = P + (past_key_values.length if past_key_values is not None else 0)
    _, max_new_tokens = generated_length(config, cur_len, explicit)
    num_canvases = math.ceil(max_new_tokens / L)
    if cur_len + num_canvases * L > text.max_position_embeddings:
        raise ValueError(
            f"prompt ({cur_len}) + new tokens ({num_canvases} canvases of {L}) exceed max_position_embeddings "
            f"({text.max_position_embeddings})"
        )
    check_token_range(config, V)
    keep = None
    if attention_mask is not None:
        mask = padding_vector("attention_mask", attention_mask, B, (cur_len,))
        check_left_padding("attention_mask", mask)
        if not bool(mask.all()):
            keep = torch.cat([mask, mask.new_ones(B, num_canvases * L)], dim=1)  # [B, all slots]
    decoder_input_ids = rest.get("decoder_input_ids")
    if decoder_input_ids is not None:
        check_token_ids("decoder_input_ids", decoder_input_ids, V)
        if tuple(decoder_input_ids.shape) != (B, L):
            raise ValueError(f"`decoder_input_ids` must have shape [{B}, {L}], got {list(decoder_input_ids.shape)}")
    sc_logits = rest.get("self_conditioning_logits")
    if sc_logits is not None and tuple(sc_logits.shape) != (B, L, V):
        raise ValueError(f"`self_conditioning_logits` must have shape [{B}, {L}, {V}], got {list(sc_logits.shape)}")
    if sc_logits is not None and (not sc_logits.dtype.is_floating_point or not bool(sc_logits.isfinite().all())):
        what = " with non-finite entries" if sc_logits.dtype.is_floating_point else ""
        raise ValueError(f"`self_conditioning_logits` must be finite floats (no NaN or Inf), got dtype "
                         f"{sc_logits.dtype}{what}")
    if sampling is not None and not isinstance(sampling, str):
        raise TypeError(f"`sampling` must be a string or None, got {sampling!r}")
    sampler_class = sampler_class_for(config.sampler_config, sampling)
    fast = sampler_class.per_row
    if sampling is None:
        sampling = next(name for name, cls in sampler_names(config.sampler_config) if cls is sampler_class)
    if not fast and (seed is not None or generator is not None):
        raise ValueError(f"`seed` and `generator` apply to samplers that draw per row (such as sampling='fast'); "
                         f"sampling={sampling!r} draws from the global RNG like the built-in class (use "
                         f"torch.manual_seed)")
    if fast and B > 1 and getattr(streamer, "_takes_logits", False):
        raise ValueError("a streamer with `_takes_logits=True` needs sampling='reference' or a batch of 1: fast mode "
                         "skips the LM head for rows that stopped denoising, so their logits do not exist")
    options = run_options(batching, max_batch_size, compile, batch_invariant, return_trace, trace_top_k,
                          trace_sc_embedding, fast, B, streamer, past_key_values)
    trace_width = options.trace_top_k
    if trace_width is not None and past_key_values is not None:
        raise ValueError("`return_trace=True` records the whole sequence from the prompt on: it cannot continue "
                         "`past_key_values` (pass the full prompt instead)")
    if trace_width is not None and (rest.get("pixel_values") is not None or rest.get("mm_encoder_outputs")):
        raise ValueError("`return_trace=True` records text prompts only: a trace's replay re-encodes the prompt from "
                         "its token ids, without the images")
    eos = config.eos_token_id
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=device) if eos is not None else None
    check_seed(seed, B)
    automaton = resolve_constraint(as_constraint(constraint), tokenizer, config, V, eos)
    generators = row_generators(B, device, seed, generator) if fast else None
    images = prompt_images(model, input_ids, **{k: rest.get(k) for k in VISION_INPUTS})  # the one vision-tower run
    if images is None or images.features is None:
        warn_if_images_missing(model.config, input_ids)
    return GenerationRun(
        config=config, input_ids=input_ids, attention_mask=attention_mask, keep=keep, cur_len=cur_len,
        num_canvases=num_canvases, sampling=sampling, batching=options.batching, max_batch_size=max_batch_size,
        options=options,
        generators=generators,
        sampler=sampler_class(config.sampler_config, SamplerContext(V, config.max_denoising_steps)),
        processors=LogitsProcessorList(logits_processor) if logits_processor else None,
        user_criteria=StoppingCriteriaList(stopping_criteria) if stopping_criteria else None,
        eos_ids=eos_ids, decoder_input_ids=decoder_input_ids, self_conditioning_logits=sc_logits,
        past_key_values=past_key_values, trace_top_k=trace_width, trace_sc_embedding=bool(trace_sc_embedding),
        images=images, position_offsets=tuple(prompt_lengths(attention_mask, B, cur_len)),
        constraint=constraint if automaton is not None else None, tokenizer=tokenizer, automaton=automaton,
        max_new_tokens=max_new_tokens,
    )


def resolve_constraint(constraint, tokenizer, config, vocab_size: int, eos) -> TokenAutomaton | None:
    """The compiled constraint (cached per constraint and tokenizer), or None without one."""
    if constraint is None:
        return None
    pad = config.pad_token_id if config.pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise ValueError("`constraint` needs a `pad_token_id` (from the generation config or the tokenizer): after "
                         "an answer ends, the rest of its canvas is padding")
    eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    return compile_constraint(constraint, tokenizer, vocab_size, eos_ids, pad)


def prompt_lengths(attention_mask: torch.Tensor | None, batch: int, width: int) -> list[int]:
    """[B] host ints: each row's prompt tokens without left padding (one host read, once per call)."""
    if attention_mask is None:
        return [width] * batch
    return [int(n) for n in attention_mask.sum(dim=1).tolist()]
