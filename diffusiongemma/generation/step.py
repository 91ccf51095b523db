"""Lock-step's use of the one denoising step: every row of the batch reads one shared `BlockDiffusionCache`.
`denoise_step(model, state, settings) -> CanvasState` runs the decoder over the whole batch, hands the rows that
sample to `engine.denoise_rows`, and scatters the result back.

Which rows sample is lock-step policy: reference mode runs every row (the built-in draws random numbers for all of
them) and keeps what stopped rows had; a per-row sampler runs only `state.rows`, the rows still denoising, named on
the host by the outer loop (it reads the [B] stop flags once per step), their device indices found on the device.
So the step reads no device value on the host.

Legend: B batch, B' rows that sample (B in reference mode), L canvas length, V vocab, H hidden.
"""

from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..modeling.cache import BlockDiffusionCache
from .engine import Plan, StepRows, denoise_rows, soft_embedder
from .state import CanvasState

__all__ = ["StepSettings", "denoise_step", "row_index", "soft_embedder"]


@dataclass(frozen=True)
class StepSettings:
    """Resolved once per `generate` call; read by every step.

    Attributes:
        plan: the sampler, stopper, temperature schedule and processors (`engine.Plan`).
        cache: the shared cache the decoder reads.
        keep: [B, all slots] bool padding mask, or None.
        skip_finished: per-row sampler: the head, processors and sampler run only for `state.rows`.
        generators: one per batch row (per-row samplers), else None.
        position_offsets: [B] host ints, each row's prompt length without padding (processors' `position_offsets`
            add the canvases committed so far).
        keep_logits: keep the tempered logits in `state.draft_logits` (a streamer that takes logits, or a trace).
        denoise_pass: `generate(compile=...)`: the fixed-shape compiled pass (`modeling.compile.DenoisePass`), which
            returns the logits of every row; None: the exact eager decoder, then the head for the rows that sample.
    """

    plan: Plan
    cache: BlockDiffusionCache
    keep: torch.Tensor | None
    skip_finished: bool
    generators: list | None
    position_offsets: list[int]
    keep_logits: bool = False
    denoise_pass: Callable | None = None

    @property
    def max_steps(self) -> int:
        return self.plan.max_steps


def row_index(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Device indices [count] of the True entries of mask [B], ascending, without reading the mask on the host
    (`count`, the number of True entries, is known there): a stable sort puts the True rows first, in order."""
    return torch.argsort((~mask).to(torch.int32), stable=True)[:count]


def denoise_step(model, state: CanvasState, settings: StepSettings) -> CanvasState:
    """One lock-step denoising step (spec D.4.4a-i) -> the next `CanvasState` (steps_remaining one lower)."""
    B, L = state.canvas.shape
    rows = state.rows if state.rows is not None else list(range(B))
    # a. count a pass for every row still working
    working = ~(state.finished_denoising | state.finished_sequences)  # [B]
    passes = state.forward_passes + working.int()
    index = row_index(working, len(rows)) if len(rows) < B else None  # [B'] or every row
    pick = (lambda t: t) if index is None else (lambda t: t[index])
    # b. decoder over every row (they share the cache); the rows that sample go on
    hidden, logits = None, None
    if settings.denoise_pass is not None:  # compiled: decoder + head over all B rows, the same shapes every step
        logits = pick(settings.denoise_pass(state.canvas, settings.cache, state.soft, settings.keep))  # [B', L, V]
    else:
        hidden = pick(model.denoise(state.canvas, settings.cache, state.soft, keep=settings.keep))  # [B', L, H]
    canvases_done = (state.sequences.shape[1] - state.prompt_width) // L
    sampled = StepRows(
        hidden=hidden, logits=logits, canvas=pick(state.canvas), sequences=pick(state.sequences), row_ids=rows,
        position_offsets=[settings.position_offsets[b] + canvases_done * L for b in rows],
        steps_remaining=[state.steps_remaining] * len(rows),
        generators=[settings.generators[b] for b in rows] if settings.generators is not None else None,
        stop_state=pick(state.stop_state) if state.stop_state is not None else None,
        sampler_state=pick(state.sampler_state) if state.sampler_state is not None else None,
    )
    out = denoise_rows(model, settings.plan, sampled, keep_logits=settings.keep_logits)  # b-i
    canvas, argmax, accepted, entropy, soft = out.canvas, out.argmax, out.accepted, out.entropy, out.soft
    stop, stop_state, faults = out.stop, out.stop_state, out.faults
    if index is not None:  # scatter the rows that sampled back; the others keep what they had
        canvas = state.canvas.index_copy(0, index, canvas)
        argmax = state.argmax_canvas.index_copy(0, index, argmax)
        entropy = torch.full(argmax.shape, float("inf"), device=argmax.device).index_copy(0, index, entropy)
        accepted = torch.zeros_like(argmax, dtype=torch.bool).index_copy(0, index, accepted)
        faults = faults.new_zeros(B).index_copy(0, index, faults)
        stop = torch.zeros(B, dtype=torch.bool, device=stop.device).index_copy(0, index, stop)
        if stop_state is not None:
            stop_state = state.stop_state.index_copy(0, index, stop_state)
        if out.sampler_state is not None:
            out.sampler_state = state.sampler_state.index_copy(0, index, out.sampler_state)
        if state.soft is not None:
            soft = state.soft.index_copy(0, index, soft.to(state.soft.dtype))
        else:
            soft = soft.new_zeros(B, *soft.shape[1:]).index_copy(0, index, soft)
    # h. reference mode: rows that already stopped keep their canvas, argmax, self-conditioning and stopper history
    # (a per-row sampler never ran them); a where over every row, so no host read of whether any row stopped
    done = state.finished_denoising
    if not settings.skip_finished and state.soft is not None:
        argmax = torch.where(done[:, None], state.argmax_canvas, argmax)
        canvas = torch.where(done[:, None], state.canvas, canvas)
        soft = torch.where(done[:, None, None], state.soft, soft)
    # i. the stopper's decision stays on the device; so do the fault codes (finite.py)
    return replace(state, canvas=canvas, argmax_canvas=argmax, soft=soft, finished_denoising=done | stop,
                   forward_passes=passes, steps_remaining=state.steps_remaining - 1, draft_logits=out.logits,
                   faults=faults, entropy=entropy, accepted=accepted, stop_state=stop_state,
                   sampler_state=out.sampler_state,
                   temperature=out.temperature[0])
