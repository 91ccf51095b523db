"""One denoising step (spec D.4.4a-i): decoder, LM head, processors and temperature, sampler, acceptance and
re-noising, self-conditioning, stopping. `denoise_step(model, state, settings) -> CanvasState`.

The step reads no device value on the host (no `.item()`, `.tolist()`, `bool(tensor)`, `nonzero`): in fast mode the
rows that still denoise arrive as a host-side list in the state (the outer loop reads the [B] stop flags once per
step), and their device indices are found on the device. So on a GPU a step queues its kernels without waiting.

Legend: B batch, B' rows that run (B in reference mode), L canvas length, V vocab, H hidden.
"""

from dataclasses import dataclass, replace

import torch
from transformers import LogitsProcessorList

from ..modeling.cache import BlockDiffusionCache
from .entropy_bound import Sampler, SoftEmbed
from .finite import fault_codes, model_logits_bad, processed_scores_bad, raise_for_faults
from .state import CanvasState
from .stopping import StableAndConfidentStopper


@dataclass(frozen=True)
class StepSettings:
    """Resolved once per `generate` call; read by every step.

    Attributes:
        max_steps: N, the denoising steps per canvas.
        temperatures: [N + 1] fp32 on the device, entry n the temperature with n steps remaining (spec D.4c).
        sampler / stopper: picked once (the stopper keeps its per-canvas history).
        processors: user logits processors (3-D scores), or None.
        cache: the shared cache the decoder reads.
        keep: [B, all slots] bool padding mask, or None.
        skip_finished: fast mode: the head, processors and sampler run only for `state.rows`.
        soft_embed: turns the sampler's probabilities into the self-conditioning input, or None: reference mode with
            non-fp32 embeddings, where it must come from the logits (`soft_embedder`).
        keep_logits: keep the tempered logits in `state.draft_logits` (a streamer that takes logits, or trace
            recording).
    """

    max_steps: int
    temperatures: torch.Tensor
    sampler: Sampler
    stopper: StableAndConfidentStopper
    processors: LogitsProcessorList | None
    cache: BlockDiffusionCache
    keep: torch.Tensor | None
    skip_finished: bool
    soft_embed: SoftEmbed | None
    keep_logits: bool = False


def soft_embedder(stack, exact_reference: bool) -> SoftEmbed | None:
    """The self-conditioning input built from a step's softmax probabilities, or None when it must come from the
    logits instead.

    Reference mode reuses the sampler's fp32 probabilities only with fp32 embeddings, where the built-in's
    softmax(logits.to(embedding dtype)) is the very same tensor; fast mode always does (like vLLM, spec E).
    """
    if exact_reference and stack.embed_tokens.weight.dtype != torch.float32:
        return None
    return stack.embed_tokens.soft


def row_index(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Device indices [count] of the True entries of mask [B], ascending, without reading the mask on the host
    (`count`, the number of True entries, is known there): a stable sort puts the True rows first, in order."""
    return torch.argsort((~mask).to(torch.int32), stable=True)[:count]


def denoise_step(model, state: CanvasState, settings: StepSettings) -> CanvasState:
    """One denoising step (spec D.4.4a-i) -> the next `CanvasState` (steps_remaining one lower).

    With `settings.skip_finished` (fast mode) the LM head, the sampler and self-conditioning run only for
    `state.rows`; reference mode runs every row, because the built-in draws random numbers for all of them.
    """
    stack = model.get_decoder()
    B = state.canvas.shape[0]
    rows = state.rows
    # a. count a pass for every row still working
    working = ~(state.finished_denoising | state.finished_sequences)  # [B]
    passes = state.forward_passes + working.int()
    index = row_index(working, len(rows)) if rows is not None and len(rows) < B else None  # [B'] or every row
    # b. decoder (every row: they share the cache) + LM head (only the rows that sample)
    hidden = model.denoise(state.canvas, settings.cache, state.soft, keep=settings.keep)  # [B, L, H]
    logits = model.head(hidden if index is None else hidden[index])  # [B', L, V] fp32
    model_bad = model_logits_bad(logits)  # [B'] on the device: the loop reads it with the stop flags (finite.py)
    # c. user processors first (they get 3-D scores and the committed tokens), then the temperature, in place
    processors_bad, empty = None, None
    if settings.processors:
        seen = state.sequences if index is None else state.sequences[index]
        shape = logits.shape
        logits = settings.processors(seen, logits, cur_step=torch.tensor(state.steps_remaining, dtype=torch.int32))
        processors_bad, empty = processed_scores_bad(logits, shape)  # [B'] each; shape checked on the host
    logits = logits.div_(settings.temperatures[state.steps_remaining])
    # d-g. one pass over the logits: argmax, entropy, sample (RNG), accept, re-noise (RNG), self-conditioning input
    soft = None
    if settings.soft_embed is None:  # from the logits, before the sampler may overwrite them (no RNG involved)
        soft = stack.soft_embedding(logits, round_to=stack.embed_tokens.weight.dtype)  # [B, L, H]
    kept = logits.clone() if settings.keep_logits else None
    try:
        out = settings.sampler.step(logits, rows, settings.soft_embed)
    except RuntimeError:  # the reference multinomial refuses NaN: name the cause (an error path may read the host)
        empty = empty if empty is not None else torch.zeros_like(model_bad)
        raise_for_faults(fault_codes(model_bad, processors_bad, empty).tolist(),
                         settings.max_steps - state.steps_remaining + 1, None, rows)
        raise
    del logits
    soft = out.soft if soft is None else soft
    canvas, argmax, entropy = out.canvas, out.argmax, out.entropy
    empty = entropy.isnan().any(dim=-1) if empty is None else empty | entropy.isnan().any(dim=-1)  # [B']
    faults = fault_codes(model_bad, processors_bad, empty)  # [B'] int8
    if index is not None:  # scatter the working rows back; the others keep what they had
        canvas = state.canvas.index_copy(0, index, canvas)
        argmax = state.argmax_canvas.index_copy(0, index, argmax)
        entropy = torch.full(argmax.shape, float("inf"), device=argmax.device).index_copy(0, index, entropy)
        faults = faults.new_zeros(B).index_copy(0, index, faults)
        if state.soft is not None:
            soft = state.soft.index_copy(0, index, soft.to(state.soft.dtype))
        else:
            soft = soft.new_zeros(B, *soft.shape[1:]).index_copy(0, index, soft)
    # h. reference mode: rows that already stopped keep their canvas, argmax and self-conditioning (fast mode never
    # ran them); a where over every row, so no host reads whether any row stopped
    done = state.finished_denoising
    if not settings.skip_finished and state.soft is not None:
        argmax = torch.where(done[:, None], state.argmax_canvas, argmax)
        canvas = torch.where(done[:, None], state.canvas, canvas)
        soft = torch.where(done[:, None, None], state.soft, soft)
    # i. the stopper's decision stays on the device; so do the fault codes (finite.py: NaN/Inf logits, or an all
    # -inf row, which makes the reference's multinomial raise, while the fast sampler's arithmetic would yield NaN)
    done = done | settings.stopper(argmax, entropy)
    return replace(state, canvas=canvas, argmax_canvas=argmax, soft=soft, finished_denoising=done,
                   forward_passes=passes, steps_remaining=state.steps_remaining - 1, draft_logits=kept,
                   faults=faults, entropy=entropy)
