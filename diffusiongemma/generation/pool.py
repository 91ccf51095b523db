"""The row pool: the one executor of denoising. Admission, prefill, the denoising pass, commit, the stop and EOS rules
and refill happen here, once, for every caller: lock-step and mixed `generate`, `diffusiongemma serve`, trace
recording and streaming (observers of the pass events).

    admit rows -> pass: one forward (`passes.py`) -> the engine step per plan (`engine.denoise_rows`) -> one host read
    -> each row's transition (next step, or its canvas ends: commit, EOS, finished) -> `PassEvents` for observers

Two admission policies:

* mixed (the default for per-row samplers, and the server): every row runs its own block-autoregressive schedule. A
  converged canvas commits at once (an encoder pass) and the row starts its next canvas while the others keep
  denoising; prefill, commit and denoising rows share one forward (`passes.RowForward`). A finished row leaves and
  its slot takes the next admitted row. Rows are independent sequences: a row's prompt has no padding, and it draws
  only from its own generator, in the order it draws when run alone. With `batch_invariant` every row runs alone
  inside the pass (`invariant.py`).
* lock-step (`Lockstep`, lockstep.py): all rows are admitted together and commit together over one shared cache
  (`passes.SharedForward`), as the built-in class runs them; a row whose canvas converged waits, frozen, for the
  others, and a row that finished its sequence keeps its place (its canvases are padding). Rows of one plan sample
  in one engine call, so a global-RNG sampler draws in the built-in's order.

Host syncs: the bookkeeping (phase, lengths, steps) stays on the host; a pass reads the device once: every
denoising row's stop, EOS and fault flags in one `.tolist()` (plus the drafts some rows stream).

Legend: n rows in the pool, d denoising rows, T tokens in a pass, L canvas length, V vocab, H hidden.
"""

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..modeling.cache import RowCache
from ..modeling.compile import compiled_denoise_pass
from ..modeling.host import device_tensor
from ..modeling.vision import PromptImages
from .engine import Plan, StepResult, StepRows, denoise_rows
from .finite import NonFiniteLogitsError, raise_for_faults
from .invariant import PerRowCaches
from .passes import COMMIT, DENOISE, PREFILL, Forward, RowForward
from .sampler import init_sampler_state
from .stopping import pad_after_eos

__all__ = ["COMMIT", "DENOISE", "PREFILL", "PassEvents", "PassRecord", "Row", "RowPool"]


@dataclass(eq=False)  # rows are compared by identity (they hold tensors)
class Row:
    """One sequence's progress in the pool. `tokens` is what the next pass feeds: the prompt, a canvas to commit, or
    the canvas being denoised."""

    index: int  # identity: the row in the request batch, or a request's number
    prompt: torch.Tensor  # [P_r] without padding
    plan: Plan
    generator: torch.Generator | None  # the row's own random state (per-row samplers)
    num_canvases: int  # at most this many canvases
    eos_ids: torch.Tensor | None = None  # [E]
    pad_token_id: int | None = None
    first_canvas: torch.Tensor | None = None  # [L] seeds the first canvas
    first_soft: torch.Tensor | None = None  # [L, H] self-conditioning input of the first step
    offset: int | None = None  # position of its first prompt token's successor: its prompt length without padding
    images: PromptImages | None = None  # [1, P_r] the prompt's image soft tokens (prefill only)
    draft: bool = False  # report the argmax canvas and its entropy after every step (`PassEvents.drafts`)
    owner: object = None  # the caller's handle (the server's job)
    phase: str = PREFILL
    tokens: torch.Tensor | None = None  # [T_r]
    argmax: torch.Tensor | None = None  # [L] argmax canvas of the latest step
    soft: torch.Tensor | None = None  # [L, H] self-conditioning input, None on a canvas' first step
    steps_remaining: int = 0
    passes: int = 0
    canvases: list = field(default_factory=list)  # committed [L] canvases
    stop_state: torch.Tensor | None = None  # [1, ...] the stopper's history
    sampler_state: torch.Tensor | None = None  # [1, ...] a stateful sampler's state
    stopped: bool = False  # lock-step: its stopper fired; it waits, frozen, for the others to commit
    done: bool = False  # lock-step: its sequence finished; it keeps its place until every row has

    def __post_init__(self):
        if self.tokens is None:
            self.tokens = self.prompt

    @property
    def position_offset(self) -> int:
        """Its prompt length without padding (what processors' `position_offsets` start from)."""
        return self.offset if self.offset is not None else len(self.prompt)


@dataclass
class PassEvents:
    """What one pass did, for the caller's policy (streaming, errors)."""

    stepped: list = field(default_factory=list)  # rows that ran a denoising step
    drafts: list = field(default_factory=list)  # (row, argmax [1, L], entropy [1, L] fp32), on the CPU, for rows
    # with `draft`
    committed: list = field(default_factory=list)  # (row, canvas [L]) canvases that ended this pass
    finished: list = field(default_factory=list)  # rows that are done (already out of the pool)
    faulted: list = field(default_factory=list)  # (row, error): NonFiniteLogitsError, or what its plan's step raised;
    # out of the pool
    records: list = field(default_factory=list)  # `PassRecord`s, one per engine call (only when the pool records)


@dataclass
class PassRecord:
    """One engine call of a pass, for observers that need more than tokens (traces, logits streamers).

    Attributes:
        rows: the rows of the call's group (lock-step: every row of the batch, in order).
        sampled: indices into `rows` of the rows the engine ran (the others kept what they had).
        canvas: [g, L] the canvases the decoder read; soft: [g, L, H] their self-conditioning input, or None.
        steps_remaining: the n (N..1) of the step.
        active: [g] bool, the rows whose result counts (not stopped, not finished) when the step began.
        result: the engine's `StepResult` for the sampled rows (with the tempered logits when the pool records).
        frozen: [g] bool, the rows whose stopper had fired before the step (lock-step), or None: none had.
        canvas_index: the canvas the step denoised (0-based).
        row_steps_remaining / row_canvas_index: per row of `rows`, its n and canvas when the step began (mixed
            batching, where the rows of one call are at different canvases and steps), or None: every row is at
            `steps_remaining` and `canvas_index` (lock-step).
    """

    rows: list
    sampled: list[int]
    canvas: torch.Tensor
    soft: torch.Tensor | None
    steps_remaining: int
    active: torch.Tensor
    result: StepResult
    frozen: torch.Tensor | None = None
    canvas_index: int = 0
    row_steps_remaining: list[int] | None = None
    row_canvas_index: list[int] | None = None


class RowPool:
    """Up to `slots` rows sharing one forward per pass.

    Args:
        model: the `DiffusionGemmaForBlockDiffusion`.
        slots: most rows in the pool.
        capacity: cache slots per row (mixed: `RowCache` room, incl. padding queries of the longest pass).
        stop_after_canvas: optional policy called with the rows whose canvas ended without finishing their sequence;
            returns one bool per row: stop this row now (user stopping criteria, a client that left).
        batch_invariant: every row runs its own forward and its own engine step at the shapes of its solo run, so
            its logits and tokens never depend on the other rows (`invariant.py` lists what this closes).
        lockstep: the lock-step policy (`lockstep.Lockstep`: all rows admitted together, committing together, over
            its shared forward), or None for mixed batching.
        record: keep every engine call's `PassRecord` (with the tempered logits) in the events, for observers.
        compile: mixed batching: the `compiled_denoise_pass` options (mode, backend): denoising runs through the
            fixed-shape `RowDenoisePass` of each row bucket (`passes.RowForward`), or None (eager).
        denoise_capacity: with `compile`, the slots C' every compiled pass attends (its capacity bucket; at least
            every row's prompt and canvases), at most `capacity`.
    """

    def __init__(self, model, slots: int, capacity: int, device: torch.device,
                 stop_after_canvas: Callable[[list[Row]], list[bool]] | None = None, batch_invariant: bool = False,
                 lockstep=None, record: bool = False, compile: dict | None = None, denoise_capacity: int = 0):
        self.model, self.L = model, model.canvas_length
        self.slots = slots
        self.batch_invariant = batch_invariant
        self.lockstep = lockstep
        self.record = record
        if lockstep is not None:
            self.forward = lockstep.forward
        else:
            cache_class = PerRowCaches if batch_invariant else RowCache
            self.cache = cache_class(model.get_decoder().shapes, slots, capacity, device)
            denoise_pass = None
            if compile is not None:
                if batch_invariant:
                    raise ValueError("batch_invariant=True runs every row at its solo shapes; it cannot share the "
                                     "compiled fixed-shape pass (compile)")
                denoise_pass = compiled_denoise_pass(model, rows=True, **compile)
            self.forward = RowForward(model, self.cache, batch_invariant, denoise_pass, denoise_capacity)
        self.stop_after_canvas = stop_after_canvas
        self.active: list[Row] = []
        self.passes = 0

    def __len__(self) -> int:
        return len(self.active)

    @property
    def free(self) -> int:
        return self.slots - len(self.active)

    def admit(self, row: Row) -> None:
        """Take `row` into a free slot; it prefills in the next pass."""
        if not self.free:
            raise RuntimeError("the row pool is full")
        self.forward.reset(len(self.active))
        self.active.append(row)

    def remove(self, rows: list[Row]) -> None:
        """Take rows out (compacting: the last row moves into a freed slot)."""
        for slot in sorted((self.active.index(r) for r in rows), reverse=True):
            last = len(self.active) - 1
            if slot != last:
                self.forward.move(last, slot)
                self.active[slot] = self.active[last]
            self.active.pop()

    def step(self) -> PassEvents:
        """One forward over the pool, then every row's transition."""
        events = PassEvents()
        out: Forward = self.forward(self.active)
        self.passes += 1
        if self.lockstep is not None:
            self.lockstep.pass_done(self, out, events)
        else:
            if out.sampled:  # hidden [d, L, H], or logits [d, L, V] from a compiled pass
                self._denoise([self.active[i] for i in out.sampled], out.hidden, events, out.logits)
            for r in out.encoding:  # prefill or commit done: the next canvas starts
                self._start_canvas(r)
        self.remove(events.finished + [r for r, _ in events.faulted])
        return events

    def _start_canvas(self, r: Row) -> None:
        """Spec D.4.3: a fresh noise canvas from the row's own generator, the stopper's state fresh."""
        plan, device = r.plan, r.prompt.device
        generators = [r.generator] if r.generator is not None else None
        r.tokens = plan.sampler.init_canvas(1, self.L, device, generators)[0]  # RNG: canvas init, as alone
        r.soft = None
        if not r.canvases and r.first_canvas is not None:
            r.tokens = r.first_canvas
        if not r.canvases and r.first_soft is not None:
            r.soft = r.first_soft
        r.argmax = r.tokens
        r.phase, r.steps_remaining = DENOISE, plan.max_steps
        r.stop_state = plan.stopper.init_state(1, self.L, device)
        r.sampler_state = init_sampler_state(plan.sampler, 1, self.L, device)

    def engine_step(self, group: list[Row], hidden, logits=None, sequences=None) -> StepResult:
        """The one engine step for the rows of one plan: hidden [g, L, H] (or logits [g, L, V]) -> `StepResult`.

        sequences: the committed tokens processors see ([g, S'] in lock-step); by default one tensor per row."""
        plan = group[0].plan
        states, sampler_states = [r.stop_state for r in group], [r.sampler_state for r in group]
        if sequences is None:
            sequences = ([torch.cat([r.prompt, *r.canvases]) for r in group]
                         if plan.processors or plan.constraint is not None else [])
        return denoise_rows(self.model, plan, StepRows(
            hidden=hidden, logits=logits, canvas=torch.stack([r.tokens for r in group]), sequences=sequences,
            row_ids=[r.index for r in group],
            position_offsets=[r.position_offset + len(r.canvases) * self.L for r in group],
            steps_remaining=[r.steps_remaining for r in group],
            generators=[r.generator for r in group] if plan.sampler.per_row else None,
            stop_state=torch.cat(states) if states[0] is not None else None,
            sampler_state=torch.cat(sampler_states) if sampler_states[0] is not None else None,
        ), keep_logits=self.record)

    def _denoise(self, rows: list[Row], hidden, events: PassEvents, logits=None) -> None:
        """The engine step for the denoising rows (hidden [d, L, H], or d [1, L, H] in batch-invariant mode, or
        logits [d, L, V] from a compiled pass), one call per plan (batch-invariant: per row, invariant.py place 2),
        then one host read."""
        groups: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            groups.setdefault(id(r) if self.batch_invariant else id(r.plan), []).append(j)
        results = []
        for members in groups.values():
            group = [rows[j] for j in members]
            source = hidden if logits is None else logits
            if self.batch_invariant:
                picked = source[members[0]]
            else:
                index = device_tensor(members, torch.long, source.device) if len(members) < len(rows) else None
                picked = source if index is None else source[index]
            before = (torch.stack([r.tokens for r in group]), soft_of(group)) if self.record else None
            try:
                out = (self.engine_step(group, picked) if logits is None
                       else self.engine_step(group, None, logits=picked))
            except Exception as error:  # noqa: BLE001 - one plan's failure (its sampler, stopper, processors) fails
                # only the rows of that plan; the others' step and state are untouched
                events.faulted += [(r, error) for r in group]
                continue
            if before is not None:
                events.records.append(PassRecord(group, list(range(len(group))), before[0], before[1],
                                                 group[0].steps_remaining, torch.ones(len(group), dtype=torch.bool),
                                                 out, canvas_index=len(group[0].canvases),
                                                 row_steps_remaining=[r.steps_remaining for r in group],
                                                 row_canvas_index=[len(r.canvases) for r in group]))
            results.append((group, out))
        flags = []
        for group, out in results:
            has_eos = torch.stack([torch.isin(out.argmax[j], r.eos_ids).any() if r.eos_ids is not None
                                   else out.stop.new_zeros(()) for j, r in enumerate(group)])
            flags.append(torch.stack([out.stop.to(torch.int8), has_eos.to(torch.int8), out.faults]))  # [3, g]
        drafting = [(r, out.argmax[j], out.entropy[j]) for group, out in results for j, r in enumerate(group)
                    if r.draft]
        host = torch.cat(flags, dim=1).tolist() if flags else [[], [], []]  # [3, d]: the one host read of this pass
        drafts = torch.stack([a for _, a, _ in drafting]).cpu() if drafting else None  # [d', L]
        entropies = torch.stack([e for _, _, e in drafting]).float().cpu() if drafting else None  # [d', L]
        k = 0
        ending = []
        for group, out in results:
            for j, r in enumerate(group):
                stop, has_eos, fault = host[0][k], host[1][k], host[2][k]
                k += 1
                try:
                    raise_for_faults([fault], r.plan.max_steps - r.steps_remaining + 1, len(r.canvases), [r.index])
                except NonFiniteLogitsError as error:
                    events.faulted.append((r, error))
                    continue
                r.tokens, r.argmax, r.soft = out.canvas[j], out.argmax[j], out.soft[j]
                r.stop_state = out.stop_state[j : j + 1] if out.stop_state is not None else None
                r.sampler_state = out.sampler_state[j : j + 1] if out.sampler_state is not None else None
                r.passes += 1
                r.steps_remaining -= 1
                events.stepped.append(r)
                if stop or r.steps_remaining == 0:
                    ending.append((r, has_eos))
        for i, (r, _, _) in enumerate(drafting):
            events.drafts.append((r, drafts[i][None], entropies[i][None]))
        self._finish_canvases(ending, events)

    def _finish_canvases(self, ending: list, events: PassEvents) -> None:
        """Append each ending row's argmax canvas (EOS-padded); a row not done commits it to the cache next pass."""
        undecided = []
        for r, has_eos in ending:
            canvas = commit_canvas(r, has_eos)
            events.committed.append((r, canvas))
            if has_eos or len(r.canvases) >= r.num_canvases:
                events.finished.append(r)
            else:
                undecided.append(r)
        if self.stop_after_canvas is not None and undecided:
            verdicts = self.stop_after_canvas(undecided)
            events.finished += [r for r, stop in zip(undecided, verdicts) if stop]
            undecided = [r for r, stop in zip(undecided, verdicts) if not stop]
        for r in undecided:
            r.phase, r.tokens = COMMIT, r.canvases[-1]


def commit_canvas(r: Row, has_eos: bool) -> torch.Tensor:
    """Spec D.4.5-6, the one commit: the row's argmax canvas [L] joins its sequence; a row that had finished
    before gets a canvas of pad, and every token after the canvas' first EOS becomes pad (with a pad id)."""
    canvas = r.argmax
    if r.pad_token_id is not None:
        if r.done:
            canvas = torch.full_like(canvas, r.pad_token_id)
        elif has_eos:
            canvas = pad_after_eos(canvas[None], r.eos_ids, r.pad_token_id)[0]
    r.canvases.append(canvas)
    return canvas


def soft_of(rows: list[Row]) -> torch.Tensor | None:
    """[g, L, H] the rows' self-conditioning inputs, or None when none has one (zeros stand in for the others)."""
    have = [r.soft for r in rows if r.soft is not None]
    if not have:
        return None
    return torch.stack([r.soft if r.soft is not None else torch.zeros_like(have[0]) for r in rows])
