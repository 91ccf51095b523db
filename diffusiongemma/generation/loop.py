"""Block-autoregressive denoising `generate` (spec D.4). Reads like the spec: an outer loop over canvases, an inner
loop over denoising steps.

Legend: B batch, P prompt, L canvas length, S committed slots, V vocab, H hidden, N max denoising steps.
"""

import math
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.utils import ModelOutput, logging

from ..modeling.cache import BlockDiffusionCache
from ..modeling.compile import compile_layers
from ..modeling.validation import check_token_ids, padding_vector
from .config import resolve_generation_config
from .mixed import MixedScheduler, MixedSettings
from .sampler import apply_temperature_, make_sampler, row_generators, temperature_at
from .state import CanvasState
from .stopping import StableAndConfidentStopper, eos_in_new_tokens, pad_after_eos

MODEL_KWARGS = ("decoder_input_ids", "self_conditioning_logits")
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


@dataclass
class DiffusionGemmaGenerationOutput(ModelOutput):
    """Result of `generate` with `return_dict_in_generate=True`.

    Attributes:
        sequences: [B, P + c*L] prompt followed by the committed canvases (pad after EOS).
        tokens_per_forward: [B] float, new non-pad tokens per denoising pass of that row.
        past_key_values: the cache; holds the prompt and every canvas but the last (spec D.6).
    """

    sequences: torch.LongTensor | None = None
    tokens_per_forward: torch.Tensor | None = None
    past_key_values: object | None = None
    logits: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


BATCHING = ("mixed", "lockstep")


def resolve_batching(batching, max_batch_size, fast: bool, batch: int, streamer, past_key_values) -> str:
    """Validate `batching` / `max_batch_size`; None picks "mixed" for fast mode with several rows."""
    if batching is not None and batching not in BATCHING:
        raise ValueError(f"`batching` must be one of {list(BATCHING)}, got {batching!r}")
    if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
                                       or max_batch_size < 1):
        raise ValueError(f"`max_batch_size` must be a positive int, got {max_batch_size!r}")
    if not fast:
        if batching == "mixed" or max_batch_size is not None:
            raise ValueError("`batching='mixed'` and `max_batch_size` need sampling='fast' (reference mode "
                             "reproduces the built-in lock-step batch)")
        return "lockstep"
    if batching == "mixed" and streamer is not None:
        raise ValueError("a `streamer` follows one lock-step batch: pass batching='lockstep' (or no streamer)")
    if batching == "mixed" and past_key_values is not None:
        raise ValueError("`past_key_values` continues one shared cache: pass batching='lockstep'")
    if batching is None:
        return "mixed" if batch > 1 and streamer is None and past_key_values is None else "lockstep"
    return batching


def generate_in_chunks(model, input_ids, attention_mask, config, chunk: int, generators, logits_processor,
                       stopping_criteria, rest: dict):
    """Lock-step fast mode over consecutive chunks of `chunk` rows (the baseline that mixed batching beats)."""
    outs = []
    for a in range(0, input_ids.shape[0], chunk):
        outs.append(generate(
            model, input_ids[a : a + chunk], None if attention_mask is None else attention_mask[a : a + chunk],
            generation_config=config, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
            sampling="fast", generator=generators[a : a + chunk], batching="lockstep", return_dict_in_generate=True,
            **{k: v[a : a + chunk] for k, v in rest.items() if k in MODEL_KWARGS},
        ))
    width = max(o.sequences.shape[1] for o in outs)
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    sequences = torch.cat([torch.nn.functional.pad(o.sequences, (0, width - o.sequences.shape[1]), value=pad)
                           for o in outs])
    if not config.return_dict_in_generate:
        return sequences
    return DiffusionGemmaGenerationOutput(
        sequences=sequences, tokens_per_forward=torch.cat([o.tokens_per_forward for o in outs])
    )


@dataclass
class StepSettings:
    """Resolved once per call; read by every step."""

    max_steps: int
    t_min: float
    t_max: float


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


def soft_embedder(stack, exact_reference: bool):
    """The self-conditioning input built from a step's softmax probabilities, or None when it must come from the
    logits instead.

    Reference mode reuses the sampler's fp32 probabilities only with fp32 embeddings, where the built-in's
    softmax(logits.to(embedding dtype)) is the very same tensor; fast mode always does (like vLLM, spec E).
    """
    if exact_reference and stack.embed_tokens.weight.dtype != torch.float32:
        return None
    return stack.embed_tokens.soft


def denoise_step(
    model,
    state: CanvasState,
    steps_remaining: int,
    settings: StepSettings,
    sampler,
    stopper,
    processors: LogitsProcessorList | None,
    sequences: torch.Tensor,
    cache,
    keep: torch.Tensor | None,
    finished_sequences: torch.Tensor,
    skip_finished: bool,
    keep_logits: bool = False,
) -> tuple[CanvasState, torch.Tensor | None]:
    """One denoising step (spec D.4a-i). Returns the new state and, with `keep_logits`, the tempered logits of the rows
    that ran [B', L, V] (else None: the sampler overwrites them, so at most two [B, L, V] buffers ever exist).

    With `skip_finished` (fast mode) the LM head, the sampler and self-conditioning run only for rows still
    denoising; reference mode runs every row, because the built-in draws random numbers for all of them.
    """
    stack = model.model.decoder
    # a. count a pass for every row still working
    working = ~(state.finished_denoising | finished_sequences)  # [B]
    passes = state.forward_passes + working.int()
    rows = working.nonzero().view(-1) if skip_finished else None
    # b. decoder (every row: they share the cache) + LM head (only the rows that sample)
    hidden = model.denoise(state.canvas, cache, state.soft, keep=keep)  # [B, L, H]
    logits = model.head(hidden if rows is None else hidden[rows])  # [B', L, V] fp32
    # c. user processors first (they get 3-D scores), then the temperature schedule, in place
    if processors:
        seen = sequences if rows is None else sequences[rows]
        logits = processors(seen, logits, cur_step=torch.tensor(steps_remaining, dtype=torch.int32))
    logits = apply_temperature_(
        logits, temperature_at(steps_remaining, settings.max_steps, settings.t_min, settings.t_max)
    )
    # d-g. one pass over the logits: argmax, entropy, sample (RNG), accept, re-noise (RNG), self-conditioning input
    soft_embed = soft_embedder(stack, exact_reference=not skip_finished)
    soft = None
    if soft_embed is None:  # from the logits, before the sampler may overwrite them (no RNG involved)
        soft = stack.soft_embedding(logits.to(stack.embed_tokens.weight.dtype))  # [B, L, H]
    kept = logits.clone() if keep_logits else None
    out = sampler.step(logits, rows, soft_embed)
    del logits
    soft = out.soft if soft is None else soft
    canvas, argmax, entropy = out.canvas, out.argmax, out.entropy
    if rows is not None:  # scatter the working rows back; the others keep what they had
        canvas, argmax = state.canvas.clone(), state.argmax_canvas.clone()
        canvas[rows], argmax[rows] = out.canvas, out.argmax
        entropy = torch.full(argmax.shape, float("inf"), device=argmax.device)
        entropy[rows] = out.entropy
        if state.soft is not None:
            full = state.soft.clone()
            full[rows] = soft.to(full.dtype)
            soft = full
        elif len(rows) < len(working):
            full = soft.new_zeros(len(working), *soft.shape[1:])
            full[rows] = soft
            soft = full
    # h. rows that already stopped keep their canvas, argmax and self-conditioning
    done = state.finished_denoising
    if rows is None and state.soft is not None and bool(done.any()):
        argmax = torch.where(done[:, None], state.argmax_canvas, argmax)
        canvas = torch.where(done[:, None], state.canvas, canvas)
        soft = torch.where(done[:, None, None], state.soft, soft)
    done = done | stopper(argmax, entropy)
    return CanvasState(canvas, argmax, soft, done, passes), kept


def finalize_canvas(
    sequences: torch.Tensor,
    finished: torch.Tensor,
    canvas_length: int,
    config,
    eos_ids: torch.Tensor | None,
    user_criteria: StoppingCriteriaList | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec D.4.6: update finished rows, pad rows finished earlier and everything after a first EOS."""
    L = canvas_length
    done_now = eos_in_new_tokens(sequences, L, eos_ids)
    if config.max_length is not None:
        done_now = done_now | (sequences.shape[1] >= config.max_length)
    if user_criteria:
        done_now = done_now | user_criteria(sequences, None, new_token_length=L).to(done_now.device)
    previous = finished
    finished = previous | done_now
    pad = config.pad_token_id
    if pad is not None and bool(finished.any()):
        sequences = sequences.clone()
        sequences[previous, -L:] = pad
        if eos_ids is not None and bool(done_now.any()):
            sequences[:, -L:] = pad_after_eos(sequences[:, -L:], eos_ids, pad)
    return sequences, finished


def tokens_per_forward(new_tokens: torch.Tensor, passes: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """[B]: new tokens that are not pad (all of them without a pad id) per denoising pass (pitfall H.14)."""
    valid = (new_tokens != pad_id).sum(dim=-1) if pad_id is not None else new_tokens.shape[1]
    return valid / passes


@torch.no_grad()
def generate(
    model,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    generation_config=None,
    streamer=None,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    past_key_values=None,
    sampling: str = "reference",
    seed: int | list[int] | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    batching: str | None = None,
    max_batch_size: int | None = None,
    compile: bool | dict = False,
    **kwargs,
):
    """Generate whole canvases by block-autoregressive denoising.

    Args:
        input_ids: [B, P] prompt (left-padded for batches).
        attention_mask: [B, S+P] 1 for tokens, 0 for left padding.
        generation_config: a `DiffusionGemmaGenerationConfig`; defaults to the model's (`generation_config.json`).
        streamer: gets `put(prompt)`, `put_draft(value=argmax canvas)` every step (if it has that method), `put(canvas)`
            after every commit, then `end()`.
        logits_processor / stopping_criteria: extra processors (applied before the temperature schedule, on 3-D
            scores) and extra criteria (called after every canvas with `new_token_length=L`).
        past_key_values: a `BlockDiffusionCache` holding an earlier prefix; `input_ids` continue it.
        sampling: "reference" draws random numbers exactly like transformers' built-in `generate` (global RNG);
            "fast" draws from the same distributions with far less work and one generator per row, and skips the LM
            head and sampler for rows that stopped denoising, so a row's output does not depend on the rest of the
            batch (with lock-step batching only for rows of equal prompt length: left padding shifts positions, spec
            C.10; mixed batching strips the padding).
        seed: fast mode only: an int (row b uses seed + b) or one int per row.
        generator: fast mode only: a `torch.Generator` (per-row seeds are drawn from it) or one per row.
        batching: fast mode only. "mixed" (the default for fast mode with more than one row): rows progress
            independently; a converged canvas commits at once while other rows keep denoising, finished rows leave
            the batch, left padding is stripped, and each row's output equals running it alone. "lockstep": all rows
            commit together (the only choice in reference mode, with a streamer or with `past_key_values`).
        max_batch_size: fast mode only: at most this many rows per forward. "mixed" refills a freed slot with the
            next waiting prompt; "lockstep" runs the batch in consecutive chunks.
        compile: True compiles every decoder layer with `torch.compile` first (`modeling.compile.compile_layers`;
            sticky: the model stays compiled, `uncompile_layers` undoes it); a dict passes `mode`, `dynamic` or
            `backend` to it. The first call pays the compilation.
        **kwargs: generation config fields (max_new_tokens, max_denoising_steps, t_min, ...) override the config;
            `decoder_input_ids` [B, L] and `self_conditioning_logits` [B, L, V] seed the first canvas.
    Returns:
        `DiffusionGemmaGenerationOutput` (or the sequences [B, P + c*L] when `return_dict_in_generate=False`).
    """
    stack = model.model.decoder
    text = model.config.text_config
    V, L = text.vocab_size, model.canvas_length
    # 0. resolve and validate everything once; nothing below reads **kwargs
    config, rest, explicit = resolve_generation_config(model.generation_config, generation_config, kwargs)
    check_ar_sampling_kwargs(rest)
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
    max_length, max_new_tokens = generated_length(config, cur_len, explicit)
    num_canvases = math.ceil(max_new_tokens / L)
    if cur_len + num_canvases * L > text.max_position_embeddings:
        raise ValueError(
            f"prompt ({cur_len}) + new tokens ({num_canvases} canvases of {L}) exceed max_position_embeddings "
            f"({text.max_position_embeddings})"
        )
    keep = None
    if attention_mask is not None:
        mask = padding_vector("attention_mask", attention_mask, B, (cur_len,))
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
    cache = past_key_values if past_key_values is not None else model.new_cache()
    cache.reserve(cur_len + num_canvases * L)
    eos = config.eos_token_id
    eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=device) if eos is not None else None
    settings = StepSettings(config.max_denoising_steps, config.t_min, config.t_max)
    fast = sampling == "fast"
    if not fast and (seed is not None or generator is not None):
        raise ValueError("`seed` and `generator` apply to sampling='fast'; reference mode draws from the global RNG "
                         "like the built-in class (use torch.manual_seed)")
    batching = resolve_batching(batching, max_batch_size, fast, B, streamer, past_key_values)
    if compile is not None and compile is not False:
        if not isinstance(compile, (bool, dict)):
            raise TypeError(f"`compile` must be a bool or a dict of compile_layers options, got {compile!r}")
        compile_layers(model, **(compile if isinstance(compile, dict) else {}))
    generators = row_generators(B, device, seed, generator) if fast else None
    if max_batch_size is not None and max_batch_size < B and batching == "lockstep":
        return generate_in_chunks(model, input_ids, attention_mask, config, max_batch_size, generators,
                                  logits_processor, stopping_criteria, rest)
    sampler = make_sampler(sampling, config.sampler_config.entropy_bound, V, generators)
    stopper = StableAndConfidentStopper(config.stability_threshold, config.confidence_threshold)
    processors = LogitsProcessorList(logits_processor) if logits_processor else None
    user_criteria = StoppingCriteriaList(stopping_criteria) if stopping_criteria else None
    if batching == "mixed":
        first_soft = stack.soft_embedding(sc_logits.to(stack.embed_tokens.weight.dtype)) if sc_logits is not None \
            else None
        scheduler = MixedScheduler(
            model, sampler, lambda: StableAndConfidentStopper(config.stability_threshold, config.confidence_threshold),
            MixedSettings(num_canvases, settings.max_steps, settings.t_min, settings.t_max, eos_ids,
                          config.pad_token_id, max_batch_size or B),
            processors, user_criteria, decoder_input_ids, first_soft,
        )
        sequences, passes = scheduler.generate(input_ids, attention_mask)
        pad = config.pad_token_id
        if not config.return_dict_in_generate:
            return sequences
        return DiffusionGemmaGenerationOutput(
            sequences=sequences, tokens_per_forward=tokens_per_forward(sequences[:, P:], passes, pad)
        )
    if streamer is not None:
        streamer.put(input_ids.cpu())

    sequences = input_ids
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    passes = torch.zeros(B, dtype=torch.int32, device=device)
    for c in range(num_canvases):
        # 1. encoder: the prompt first, then the canvas committed last round (writes the cache)
        model.encode(sequences if c == 0 else sequences[:, -L:], cache, keep=keep)
        # 3. a fresh noise canvas; the draw happens even when the caller seeds the first canvas (pitfall H.9)
        if fast:  # rows that finished their sequence draw nothing and are frozen for the whole canvas
            canvas = torch.zeros(B, L, dtype=torch.long, device=device)
            canvas[~finished] = sampler.init_canvas(B, L, device, rows=(~finished).nonzero().view(-1))
        else:
            canvas = sampler.init_canvas(B, L, device)
        soft = None
        if c == 0 and decoder_input_ids is not None:
            canvas = decoder_input_ids
        if c == 0 and sc_logits is not None:
            soft = stack.soft_embedding(sc_logits.to(stack.embed_tokens.weight.dtype))
        state = CanvasState(canvas, canvas, soft, finished.clone() if fast else torch.zeros_like(finished), passes)
        stopper.reset(B)
        # 4. denoise, counting the steps remaining N..1
        takes_logits = streamer is not None and getattr(streamer, "_takes_logits", False)
        for steps_remaining in range(settings.max_steps, 0, -1):
            state, logits = denoise_step(
                model, state, steps_remaining, settings, sampler, stopper, processors, sequences, cache, keep, finished,
                skip_finished=fast, keep_logits=takes_logits,
            )
            if streamer is not None and hasattr(streamer, "put_draft"):
                if takes_logits:
                    streamer.put_draft(logits=logits.to(stack.embed_tokens.weight.dtype).cpu())
                else:
                    streamer.put_draft(value=state.argmax_canvas.cpu())
            del logits  # [B, L, V]: must not stay alive while the next step computes its own
            if bool(state.finished_denoising.all()):
                break
        passes = state.forward_passes
        # 5. commit the argmax canvas; 6. EOS and padding
        sequences = torch.cat([sequences, state.argmax_canvas], dim=-1)
        sequences, finished = finalize_canvas(sequences, finished, L, config, eos_ids, user_criteria)
        # 7. stream the committed canvas
        if streamer is not None:
            streamer.put(sequences[:, -L:].cpu())
        if bool(finished.all()):
            break
    if streamer is not None:
        streamer.end()
    if not config.return_dict_in_generate:
        return sequences
    return DiffusionGemmaGenerationOutput(
        sequences=sequences,
        tokens_per_forward=tokens_per_forward(sequences[:, P:], passes, config.pad_token_id),
        past_key_values=cache,
    )
