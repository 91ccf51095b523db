"""Block-autoregressive denoising `generate` (spec D.4): arguments are resolved once (`resolve.py`), the plan is built
once (`plan.py`), and the row pool (`pool.py`) runs every pass, under one of two admission policies:

    lock-step (`lockstep.py`): the batch (or each slice of `max_batch_size` rows) is admitted together and commits
        together over one shared cache, as the built-in class runs it;
    mixed (`mixed.py`): every row moves on by itself; a freed slot takes the next waiting prompt.

Observers follow the pool's pass events: the streamer (prompt, a draft after every step, every committed canvas) and
the trace recorder (`diffusiongemma.accuracy.record`, one record per engine call).

Legend: B batch, P prompt, L canvas length, S cached slots, V vocab, H hidden.
"""

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.utils import logging

from ..constraints.answer_check import check_answers
from ..constraints.guide import ConstraintGuide
from ..modeling.compile import capacity_bucket, compiled_denoise_pass
from ..modeling.vision import stack_rows
from .mixed import assemble, generate_mixed
from .lockstep import Lockstep
from .outputs import DiffusionGemmaGenerationOutput, generation_output, tokens_per_forward
from .recording import trace_recorder
from .resolve import GenerationRun, check_ar_sampling_kwargs, generated_length, resolve_run
from .engine import Plan, soft_embedder
from .plan import build_plan
from .observers import StreamerObserver, takes_logits, wants_drafts
from .pool import Row, RowPool

logger = logging.get_logger(__name__)

__all__ = [
    "DiffusionGemmaGenerationOutput", "check_ar_sampling_kwargs", "generate", "generated_length",
    "soft_embedder", "tokens_per_forward",
]


def plan_for(model, run: GenerationRun) -> Plan:
    """How this call's rows denoise (`plan.build_plan`): built once, shared by every row."""
    return build_plan(model, run.config, device=run.input_ids.device, processors=run.processors,
                      automaton=run.automaton, max_new_tokens=run.max_new_tokens, sampler=run.sampler)


def lockstep_slice(model, run: GenerationRun, plan: Plan, a: int, b: int, first_soft, compile_options,
                   record: bool, draft: bool) -> tuple[RowPool, object]:
    """A pool holding rows [a, b) of the batch under the lock-step policy, over a cache of their own (or the
    caller's `past_key_values`): the batch itself, or one slice of `max_batch_size` rows."""
    L, P = model.canvas_length, run.input_ids.shape[1]
    cache = run.past_key_values if run.past_key_values is not None else model.new_cache()
    slots = run.cur_len + run.num_canvases * L
    cache.reserve(capacity_bucket(slots, L) if compile_options is not None else slots)  # compiled: a shared bucket
    images = run.images
    if images is not None and b - a < run.input_ids.shape[0]:  # the slice's rows' image soft tokens (encoded once)
        images = stack_rows([images.row(i) for i in range(a, b)], [P] * (b - a), P)
    policy = Lockstep(
        model, plan, cache, run.keep[a:b] if run.keep is not None else None, images,
        compiled_denoise_pass(model, **compile_options) if compile_options is not None else None,
        run.fast, run.config.max_length, run.user_criteria,
    )
    pool = RowPool(model, b - a, 0, run.input_ids.device, lockstep=policy, record=record)
    for i in range(a, b):
        pool.admit(Row(
            index=i, prompt=run.input_ids[i], plan=plan,
            generator=run.generators[i] if run.generators is not None else None, num_canvases=run.num_canvases,
            eos_ids=run.eos_ids, pad_token_id=run.config.pad_token_id,
            first_canvas=run.decoder_input_ids[i] if run.decoder_input_ids is not None else None,
            first_soft=first_soft[i] if first_soft is not None else None, offset=run.position_offsets[i],
            draft=draft,
        ))
    return pool, cache


def generate_lockstep(model, run: GenerationRun, plan: Plan, streamer, compile_options: dict | None = None):
    """Spec D.4: the rows of each lock-step batch (the whole batch, or slices of `max_batch_size` rows) commit
    together; the pool runs every pass, the streamer and the trace recorder observe it."""
    config, L = run.config, model.canvas_length
    input_ids = run.input_ids
    B, P = input_ids.shape
    stack = model.get_decoder()
    first_soft = None
    if run.self_conditioning_logits is not None:
        first_soft = stack.soft_embedding(run.self_conditioning_logits, round_to=stack.embed_tokens.weight.dtype)
    observers = []
    if streamer is not None:
        observers.append(StreamerObserver(streamer, stack.embed_tokens.weight.dtype))
        streamer.put(input_ids.cpu())
    recorder = None
    if run.trace_top_k is not None:  # off by default: no recording work at all
        recorder = trace_recorder(model, run)  # accuracy's recorder (recording.py: generation never imports it)
        observers.append(recorder.observe)
    chunk = run.max_batch_size if run.options.mode == "slices" else B
    record = recorder is not None or takes_logits(streamer)
    draft = wants_drafts(streamer)
    rows, cache = [], None
    for a in range(0, B, chunk):
        pool, cache = lockstep_slice(model, run, plan, a, min(a + chunk, B), first_soft, compile_options, record,
                                     draft)
        rows += pool.active
        while len(pool):
            events = pool.step()
            for observe in observers:
                observe(events)
    pad = config.pad_token_id
    if pad is None and len({len(r.canvases) for r in rows}) > 1:
        logger.warning_once("lock-step chunks stopped after different numbers of canvases and there is no "
                            "`pad_token_id`: the shorter chunks' rows are filled with token 0")
    sequences = assemble(rows, input_ids, L, pad if pad is not None else 0)
    passes = torch.tensor([r.passes for r in rows], dtype=torch.int32, device=input_ids.device)
    if streamer is not None:
        streamer.end()
    trace = recorder.finish(sequences) if recorder is not None else None
    return generation_output(config, sequences, P, passes, cache if chunk >= B else None, trace=trace)


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
            after every commit, then `end()`. With `batching` unset it selects lock-step; with batching='mixed' the
            rows commit at different times and the streamer gets the batch round by round (canvas c once every row
            committed it; `observers.RoundStreamer`).
        logits_processor / stopping_criteria: extra processors (applied before the temperature schedule, on 3-D
            scores) and extra criteria (called after every canvas with `new_token_length=L`).
        past_key_values: a `BlockDiffusionCache` holding an earlier prefix; `input_ids` continue it. Lock-step
            continues it in place and returns it; mixed batching (explicit `batching="mixed"` or `batch_invariant`)
            copies each row's committed slots into its own row cache and returns no cache, and refuses a cache that
            holds left padding (generation/options.py, `refuse_padded_prefix`).
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
            commit together (the only choice in reference mode; the default with a streamer or `past_key_values`).
        max_batch_size: fast mode only: at most this many rows per forward. "mixed" refills a freed slot with the
            next waiting prompt; "lockstep" admits the batch in consecutive slices of this many rows, each a
            lock-step batch (refused with a streamer, `past_key_values` or `return_trace`, which slices cannot
            share). What each mode cannot do is refused from one table, `generation.options.CAPABILITIES`.
        compile: True runs every denoising step as one fixed-shape `torch.compile` graph per batch bucket
            (`modeling.compile.compiled_denoise_pass`: decoder + LM head, fullgraph, no recompile across steps and
            canvases); encoder passes stay eager. The graphs are kept on the model for later calls; the first call
            pays the compilation. A dict passes `mode` ("reduce-overhead": CUDA graphs) or `backend`; True means
            {} (inductor, default mode). Mixed batching compiles per (row bucket, capacity bucket)
            (`modeling.compile.RowDenoisePass`); `compile` does not change the batching choice (with `batching`
            unset, per-row samplers and several rows run mixed). Refused with `batch_invariant`.
        batch_invariant: every row runs alone inside the row pool (its own forward and engine step, at the shapes
            of its solo run), so a seeded row's logits and tokens are bit-identical to running it alone with
            `batch_invariant=True`, whatever else shares the batch (prompt lengths, padding, `max_batch_size`).
            Implies batching="mixed" (also for one row); refuses lock-step batching, `compile`,
            samplers drawing from the global RNG, and image prompts in a batch
            of several rows (the vision tower encodes them together). Costs throughput: see docs/generation.md.
        return_trace: also return `out.trace`, a `diffusiongemma.accuracy.Trace` of every canvas and step (input
            canvas, self-conditioning top-k, argmax, entropy, accepted mask, temperature, stop decision, committed
            tokens; see docs/trace-format.md). It records the run the call makes without it: with mixed batching
            (and `batch_invariant`) one record per row and step, each row replayable as its own sequence;
            implies a dict output. Off: no cost.
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
    # 0. resolve and validate everything once (the run options and the mode: options.py); nothing below reads **kwargs
    run = resolve_run(model, input_ids, attention_mask, generation_config, streamer, logits_processor,
                      stopping_criteria, past_key_values, sampling, seed, generator, batching, max_batch_size, kwargs,
                      return_trace=return_trace, trace_top_k=trace_top_k, trace_sc_embedding=trace_sc_embedding,
                      constraint=constraint, tokenizer=tokenizer, compile=compile, batch_invariant=batch_invariant)
    plan = plan_for(model, run)
    if run.options.mode in ("mixed", "invariant"):
        invariant = run.options.mode == "invariant"
        if invariant and run.images is not None and run.input_ids.shape[0] > 1:
            raise ValueError("`batch_invariant=True` with image prompts needs one prompt per call: the vision tower "
                             "encodes a batch's images together")
        out = generate_mixed(model, run, plan, invariant, streamer)
    else:  # "lockstep", or "slices": lock-step over slices of `max_batch_size` rows
        out = generate_lockstep(model, run, plan, streamer, run.options.compile)
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
