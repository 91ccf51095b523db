"""Block-autoregressive denoising `generate` (spec D.4): an outer loop over canvases, an inner loop over denoising
steps. Arguments are resolved once in `resolve.py`; a lock-step step is `step.denoise_step` around the one engine
step (`engine.denoise_rows`); the samplers are plug-ins (`sampler.py`); mixed batching runs the row pool
(`pool.py`, via `batching.py`).

Host reads: a step reads nothing on the host; the loop reads the [B] stop flags once per step (to stop, and to name
the rows that still denoise in fast mode) and the [B] finished flags once per canvas.

Legend: B batch, P prompt, L canvas length, S cached slots, V vocab, H hidden, N max denoising steps.
"""

from dataclasses import replace
from functools import partial

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.utils import logging

from ..constraints.answer_check import check_answers
from ..constraints.guide import ConstraintGuide
from ..modeling.compile import capacity_bucket, compiled_denoise_pass
from ..modeling.masks import PaddingSlots
from .batching import generate_in_chunks, generate_mixed
from .invariant import invariant_batching
from .finite import NonFiniteLogitsError, raise_for_faults
from .outputs import DiffusionGemmaGenerationOutput, generation_output, tokens_per_forward
from .recording import trace_recorder
from .resolve import GenerationRun, check_ar_sampling_kwargs, generated_length, resolve_batching, resolve_run
from .engine import Plan, soft_embedder
from .sampler import init_sampler_state, temperature_schedule
from .state import CanvasState
from .step import StepSettings, denoise_step, row_index
from .stopping import finalize_canvas, stopper_for

logger = logging.get_logger(__name__)

__all__ = [
    "DiffusionGemmaGenerationOutput", "check_ar_sampling_kwargs", "denoise_step", "generate", "generated_length",
    "resolve_batching", "soft_embedder", "tokens_per_forward",
]


def plan_for(model, run: GenerationRun) -> Plan:
    """How this call's rows denoise: built once, shared by lock-step and the row pool."""
    config = run.config
    return Plan(
        sampler=run.sampler, stopper=stopper_for(config), max_steps=config.max_denoising_steps,
        temperatures=temperature_schedule(config.max_denoising_steps, config.t_min, config.t_max,
                                          run.input_ids.device),
        processors=run.processors, soft_embed=soft_embedder(model.get_decoder(), exact_reference=not run.fast),
        constraint=(ConstraintGuide(run.automaton, model.canvas_length, run.max_new_tokens)
                    if run.automaton is not None else None),
    )


def step_settings(model, run: GenerationRun, cache, streamer, compile_options: dict | None = None) -> StepSettings:
    """What every lock-step step reads, resolved once."""
    return StepSettings(
        plan=plan_for(model, run), cache=cache, keep=run.keep, skip_finished=run.fast, generators=run.generators,
        position_offsets=list(run.position_offsets),
        keep_logits=takes_logits(streamer) or run.trace_top_k is not None,
        denoise_pass=compiled_denoise_pass(model, **compile_options) if compile_options is not None else None,
    )


COMPILE_OPTIONS = ("mode", "backend")


def compile_options_of(compile, batching: str | None) -> dict | None:
    """`generate`'s `compile` argument -> the `compiled_denoise_pass` options, or None (no compilation)."""
    if compile is None or compile is False:
        return None
    if not isinstance(compile, (bool, dict)):
        raise TypeError(f"`compile` must be a bool or a dict of options {list(COMPILE_OPTIONS)}, got {compile!r}")
    options = compile if isinstance(compile, dict) else {}
    unknown = sorted(set(options) - set(COMPILE_OPTIONS))
    if unknown:
        raise ValueError(f"`compile` options {unknown} are not supported; supported: {list(COMPILE_OPTIONS)} "
                         "(the pass always compiles with fullgraph=True, dynamic=False)")
    if batching == "mixed":
        raise ValueError("`compile` compiles the fixed-shape lock-step denoising pass; it does not apply to "
                         "batching='mixed' (pass batching='lockstep', or leave `batching` unset)")
    return dict(options)


def takes_logits(streamer) -> bool:
    """The streamer wants the tempered logits instead of the argmax canvas as its draft (spec D.4.4j)."""
    return streamer is not None and getattr(streamer, "_takes_logits", False)


def new_canvas(model, run: GenerationRun, settings: StepSettings, sequences: torch.Tensor, finished: torch.Tensor,
               passes: torch.Tensor, live: list[int], c: int) -> CanvasState:
    """Spec D.4.3: a fresh noise canvas for canvas c, the stopper's state fresh. live: host-side rows not finished."""
    B, L = finished.shape[0], model.canvas_length
    device = finished.device
    sampler = settings.plan.sampler
    if run.fast:  # rows that finished their sequence draw nothing and stay frozen for the whole canvas
        canvas = sampler.init_canvas(len(live), L, device, [run.generators[b] for b in live])  # [B', L], RNG
        if len(live) < B:
            index = row_index(~finished, len(live))  # [B'] on the device
            canvas = torch.zeros(B, L, dtype=torch.long, device=device).index_copy(0, index, canvas)
    else:
        canvas = sampler.init_canvas(B, L, device, None)  # RNG: canvas init, drawn even for a seeded canvas (H.9)
    soft = None
    if c == 0 and run.decoder_input_ids is not None:
        canvas = run.decoder_input_ids
    if c == 0 and run.self_conditioning_logits is not None:
        stack = model.get_decoder()
        soft = stack.soft_embedding(run.self_conditioning_logits, round_to=stack.embed_tokens.weight.dtype)  # [B, L, H]
    return CanvasState(
        canvas=canvas, argmax_canvas=canvas, soft=soft,
        finished_denoising=finished.clone() if run.fast else torch.zeros_like(finished), forward_passes=passes,
        steps_remaining=settings.max_steps, sequences=sequences, finished_sequences=finished,
        rows=live if run.fast else None, stop_state=settings.plan.stopper.init_state(B, L, device),
        sampler_state=init_sampler_state(sampler, B, L, device),
        prompt_width=run.input_ids.shape[1],
    )


def still_denoising(state: CanvasState, fast: bool, step: int, canvas: int) -> tuple[CanvasState, bool]:
    """Spec D.4.4k, the one host read of a step: the [B] stop flags (and, in the same copy, the [B] fault codes of
    generation/finite.py). Returns (state, whether any row still denoises); in fast mode the state's `rows` then name
    the rows that denoise next. step (1-based) and canvas (0-based) only name the place in an error.

    Raises:
        NonFiniteLogitsError: a row's logits held NaN/Inf, or its scores left nothing to sample from.
    """
    stopped, faults = torch.stack([state.finished_denoising.to(torch.int8), state.faults]).tolist()  # 2 x [B]
    raise_for_faults(faults, step, canvas)
    if fast:
        state = replace(state, rows=[b for b, s in enumerate(stopped) if not s])
    return state, not all(stopped)


def stream_draft(streamer, state: CanvasState, embed_dtype: torch.dtype) -> None:
    """Spec D.4.4j: the argmax canvas (or, for a streamer that takes logits, the tempered logits) after a step."""
    if streamer is None or not hasattr(streamer, "put_draft"):
        return
    if takes_logits(streamer):
        streamer.put_draft(logits=state.draft_logits.to(embed_dtype).cpu())
    else:
        streamer.put_draft(value=state.argmax_canvas.cpu())


def generate_lockstep(model, run: GenerationRun, streamer, compile_options: dict | None = None):
    """Spec D.4: every row commits its canvas together."""
    config, L = run.config, model.canvas_length
    input_ids = run.input_ids
    B, P = input_ids.shape
    embed_dtype = model.get_decoder().embed_tokens.weight.dtype
    cache = run.past_key_values if run.past_key_values is not None else model.new_cache()
    slots = run.cur_len + run.num_canvases * L
    cache.reserve(capacity_bucket(slots, L) if compile_options is not None else slots)  # compiled: a shared bucket
    if run.keep is not None:  # where the padding is: read to the host once, here, so no step has to
        cache.padding = PaddingSlots.of(run.keep, cache.padding)
    settings = step_settings(model, run, cache, streamer, compile_options)
    recorder = None
    if run.trace_top_k is not None:  # off by default: no recording work at all
        recorder = trace_recorder(model, run)  # accuracy's recorder (recording.py: generation never imports it)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    sequences = input_ids  # [B, P + c*L]
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)  # [B] rows whose sequence ended
    live = list(range(B))  # host-side: the rows not finished
    passes = torch.zeros(B, dtype=torch.int32, device=input_ids.device)  # [B] denoising passes per row
    for c in range(run.num_canvases):
        # 1. encoder: the prompt first, then the canvas committed last round (writes the cache)
        # (the prompt's image soft tokens enter here, once: the cache holds them from now on, spec D.4.1-2)
        model.encode(sequences if c == 0 else sequences[:, -L:], cache, keep=run.keep,
                     images=run.images if c == 0 else None)
        # 3. a fresh noise canvas, the stopper's state fresh
        state = new_canvas(model, run, settings, sequences, finished, passes, live, c)
        if recorder is not None:
            recorder.begin_canvas(state, c)
        # 4. denoise, counting the steps remaining N..1
        for step in range(1, settings.max_steps + 1):
            try:
                before, state = state, denoise_step(model, state, settings)  # a-i: no host read
            except NonFiniteLogitsError as error:  # raised by the reference sampler's refusal: add the canvas
                raise error.at_canvas(c) from None
            if recorder is not None:
                recorder.record_step(before, state)
            stream_draft(streamer, state, embed_dtype)  # j
            state, denoising = still_denoising(replace(state, draft_logits=None), run.fast, step, c)  # k
            if not denoising:
                break
        passes = state.forward_passes
        # 5. commit the argmax canvas; 6. EOS and padding
        sequences = torch.cat([sequences, state.argmax_canvas], dim=-1)
        sequences, finished = finalize_canvas(sequences, finished, L, config.max_length, config.pad_token_id,
                                              run.eos_ids, run.user_criteria)
        # 7. stream the committed canvas; stop when every row finished (one host read per canvas)
        if streamer is not None:
            streamer.put(sequences[:, -L:].cpu())
        live = [b for b, f in enumerate(finished.tolist()) if not f]
        if not live:
            break
    if streamer is not None:
        streamer.end()
    trace = recorder.finish(sequences) if recorder is not None else None
    return generation_output(config, sequences, P, passes, cache, trace=trace)


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
    """Generate whole canvases by block-autoregressive denoising.

    Args:
        input_ids: [B, P] prompt (left-padded for batches).
        attention_mask: [B, S+P] 1 for tokens, 0 for left padding.
        generation_config: a `DiffusionGemmaGenerationConfig`; defaults to the model's (`generation_config.json`).
        streamer: gets `put(prompt)`, `put_draft(value=argmax canvas)` every step (if it has that method), `put(canvas)`
            after every commit, then `end()`. Lock-step batching only.
        logits_processor / stopping_criteria: extra processors (applied before the temperature schedule, on 3-D
            scores) and extra criteria (called after every canvas with `new_token_length=L`).
        past_key_values: a `BlockDiffusionCache` holding an earlier prefix; `input_ids` continue it. Lock-step only.
        sampling: which registered sampler of the `sampler_config` runs (None: its default; for
            `EntropyBoundSamplerConfig` "reference"). "reference" draws random numbers exactly like transformers'
            built-in `generate` (global RNG);
            "fast" draws from the same distributions with far less work and one generator per row, and skips the LM
            head and sampler for rows that stopped denoising, so a row's output does not depend on the rest of the
            batch (with lock-step batching only for rows of equal prompt length: left padding shifts positions, spec
            C.10; mixed batching strips the padding). "gumbel" is reference mode with vLLM's Gumbel-max draw instead
            of the multinomial (a semantics switch, docs/reference-accuracy.md).
        seed: fast mode only: an int (row b uses seed + b) or one int per row.
        generator: fast mode only: a `torch.Generator` (per-row seeds are drawn from it) or one per row.
        batching: fast mode only. "mixed" (the default for fast mode with more than one row): rows progress
            independently; a converged canvas commits at once while other rows keep denoising, finished rows leave
            the batch, left padding is stripped, and each row's output equals running it alone. "lockstep": all rows
            commit together (the only choice in reference mode, with a streamer or with `past_key_values`).
        max_batch_size: fast mode only: at most this many rows per forward. "mixed" refills a freed slot with the
            next waiting prompt; "lockstep" runs the batch in consecutive chunks (refused with a streamer or
            `past_key_values`, which chunks cannot share).
        compile: True runs every denoising step as one fixed-shape `torch.compile` graph per batch bucket
            (`modeling.compile.compiled_denoise_pass`: decoder + LM head, fullgraph, no recompile across steps and
            canvases); encoder passes stay eager. The graphs are kept on the model for later calls; the first call
            pays the compilation. A dict passes `mode` ("reduce-overhead": CUDA graphs) or `backend`. Lock-step
            only: it selects lock-step batching when `batching` is unset.
        batch_invariant: every row runs alone inside the row pool (its own forward and engine step, at the shapes
            of its solo run), so a seeded row's logits and tokens are bit-identical to running it alone with
            `batch_invariant=True`, whatever else shares the batch (prompt lengths, padding, `max_batch_size`).
            Implies batching="mixed" (also for one row); refuses lock-step batching, `compile`, a streamer,
            `past_key_values`, `return_trace`, samplers drawing from the global RNG, and image prompts in a batch
            of several rows (the vision tower encodes them together). Costs throughput: see docs/generation.md.
        return_trace: also return `out.trace`, a `diffusiongemma.accuracy.Trace` of every canvas and step (input
            canvas, self-conditioning top-k, argmax, entropy, accepted mask, temperature, stop decision, committed
            tokens; see docs/trace-format.md). Lock-step batching only; implies a dict output. Off: no cost.
        trace_top_k: how many of the most likely tokens a trace keeps per position (default 8).
        trace_sc_embedding: the trace also keeps each step's exact self-conditioning input [B, L, H] (4*H bytes
            per position), so a replay needs no top-k approximation.
        constraint: `diffusiongemma.Regex(pattern)` or `diffusiongemma.JsonSchema(schema)`: every committed canvas
            is the most probable one the constraint accepts, so each answer matches it (docs/constraints.md). The
            output's `truncated` [B] flags rows whose `max_new_tokens` ran out first (a warning names them).
        tokenizer: the model's tokenizer, needed with `constraint` (the automaton is compiled over its tokens).
        **kwargs: generation config fields (max_new_tokens, max_denoising_steps, t_min, ...) override the config;
            `decoder_input_ids` [B, L] and `self_conditioning_logits` [B, L, V] seed the first canvas;
            `pixel_values`, `image_position_ids`, `mm_token_type_ids` (the Gemma 4 processor's output) or
            `mm_encoder_outputs` add images to the prompt, as in `forward` (encoded once, before the first canvas).
    Returns:
        `DiffusionGemmaGenerationOutput` (or the sequences [B, P + c*L] when `return_dict_in_generate=False`).
    """
    # 0. resolve and validate everything once; nothing below reads **kwargs
    compile_options = compile_options_of(compile, batching)
    if compile_options is not None and batching is None:
        batching = "lockstep"
    batching = invariant_batching(batch_invariant, batching, compile_options, streamer, past_key_values,
                                  return_trace)
    run = resolve_run(model, input_ids, attention_mask, generation_config, streamer, logits_processor,
                      stopping_criteria, past_key_values, sampling, seed, generator, batching, max_batch_size, kwargs,
                      return_trace=return_trace, trace_top_k=trace_top_k, trace_sc_embedding=trace_sc_embedding,
                      constraint=constraint, tokenizer=tokenizer)
    if run.batching == "chunks":
        out = generate_in_chunks(partial(generate, compile=compile), model, run)
    elif run.batching == "mixed":
        if batch_invariant and run.images is not None and run.input_ids.shape[0] > 1:
            raise ValueError("`batch_invariant=True` with image prompts needs one prompt per call: the vision tower "
                             "encodes a batch's images together")
        out = generate_mixed(model, run, plan_for(model, run), batch_invariant)
    else:
        out = generate_lockstep(model, run, streamer, compile_options)
    return flag_truncated(out, run, model.canvas_length)


def flag_truncated(out, run: GenerationRun, canvas_length: int):
    """With a constraint: `out.truncated` [B], True where the answer is not a whole valid one (its text checked as
    the user decodes it: constraints/answer_check.py), and `out.truncation_reasons` saying why; a warning names
    those rows."""
    if run.automaton is None:
        return out
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    guide = ConstraintGuide(run.automaton, canvas_length, run.max_new_tokens)
    start = run.input_ids.shape[1]
    answers = sequences[:, start : start + run.max_new_tokens]  # [B, N] within the budget
    truncated, reasons = check_answers(run.automaton, run.tokenizer, answers, guide.complete(answers))
    for why in dict.fromkeys(r for r in reasons if r is not None):
        rows = [b for b, r in enumerate(reasons) if r == why]
        logger.warning(f"{why}: rows {rows} are not whole answers (see `truncated`, `truncation_reasons`)")
    if not isinstance(out, torch.Tensor):
        out.truncated = torch.tensor(truncated, device=sequences.device)
        out.truncation_reasons = reasons
    return out
