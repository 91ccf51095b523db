"""The row pool: admission, prefill, commit, refill and the prefill/denoise/commit phases, once, for mixed `generate`
and `diffusiongemma serve`.

Every row runs its own block-autoregressive schedule: a converged canvas is committed at once (an encoder pass) and
the row starts its next canvas while the others keep denoising. Prefill, commit and denoising rows share one forward
(`model.run_rows`: a causal or bidirectional flag per row over a `RowCache` with one committed length per row); the
denoising rows then go through the one engine step (`engine.denoise_rows`), grouped by their `Plan`. A row that
finished leaves, and its slot takes the next admitted row. Mixed `generate` admits every prompt and steps until the
pool is empty; the server admits from its request queue between passes.

Rows are independent sequences: a row's prompt has no padding, and it draws only from its own generator, in the
order it draws when run alone. By default rows share one forward and one engine step, so its tokens equal its solo
run only up to float rounding between batch shapes; with `batch_invariant` every row runs alone inside the pass and
its logits and tokens are bit-identical to its solo run (`invariant.py`).

Host syncs: the bookkeeping (phase, lengths, steps) stays on the host; a pass reads the device once: every
denoising row's stop, EOS and fault flags in one `.tolist()` (plus the drafts some rows stream).

Legend: n rows in the pool, d denoising rows, T tokens in a pass, L canvas length, V vocab, H hidden.
"""

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.nn.utils.rnn import pad_sequence

from ..modeling.cache import RowCache
from ..modeling.host import device_tensor
from ..modeling.vision import PromptImages, stack_rows
from .engine import Plan, StepRows, denoise_rows
from .finite import NonFiniteLogitsError, raise_for_faults
from .sampler import init_sampler_state
from .invariant import PerRowCaches
from .stopping import pad_after_eos

PREFILL, COMMIT, DENOISE = "prefill", "commit", "denoise"


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

    def __post_init__(self):
        if self.tokens is None:
            self.tokens = self.prompt


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


class RowPool:
    """Up to `slots` rows sharing one forward per pass over a `RowCache` of `capacity` tokens per row.

    Args:
        model: the `DiffusionGemmaForBlockDiffusion`.
        stop_after_canvas: optional policy called with the rows whose canvas ended without finishing their sequence;
            returns one bool per row: stop this row now (user stopping criteria, a client that left).
        batch_invariant: every row runs its own forward and its own engine step at the shapes of its solo run, so
            its logits and tokens never depend on the other rows (`invariant.py` lists what this closes).
    """

    def __init__(self, model, slots: int, capacity: int, device: torch.device,
                 stop_after_canvas: Callable[[list[Row]], list[bool]] | None = None, batch_invariant: bool = False):
        self.model, self.L = model, model.canvas_length
        self.slots = slots
        self.batch_invariant = batch_invariant
        cache_class = PerRowCaches if batch_invariant else RowCache
        self.cache = cache_class(model.get_decoder().shapes, slots, capacity, device)
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
        self.cache.reset(len(self.active))
        self.active.append(row)

    def remove(self, rows: list[Row]) -> None:
        """Take rows out (compacting: the last row moves into a freed slot)."""
        for slot in sorted((self.active.index(r) for r in rows), reverse=True):
            last = len(self.active) - 1
            if slot != last:
                self.cache.move(last, slot)
                self.active[slot] = self.active[last]
            self.active.pop()

    def step(self) -> PassEvents:
        """One shared forward over the pool, then every row's transition."""
        events = PassEvents()
        if self.batch_invariant:  # one forward per row, over its own cache (invariant.py, place 1)
            denoising, hidden, encoding = [], [], []
            for i, r in enumerate(self.active):
                d, h, e = forward_pool(self.model, [r], self.cache.row(i), self.L)
                denoising += [i] * len(d)
                hidden += [h] * len(d)  # [1, L, H] each
                encoding += e
        else:
            denoising, hidden, encoding = forward_pool(self.model, self.active, self.cache, self.L)
        self.passes += 1
        if denoising:
            self._denoise([self.active[i] for i in denoising], hidden, events)
        for r in encoding:  # prefill or commit done: the next canvas starts
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

    def _denoise(self, rows: list[Row], hidden: torch.Tensor, events: PassEvents) -> None:
        """The engine step for the denoising rows (hidden [d, L, H], or d [1, L, H] in batch-invariant mode), one
        call per plan (batch-invariant: per row, invariant.py place 2), then one host read."""
        groups: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            groups.setdefault(id(r) if self.batch_invariant else id(r.plan), []).append(j)
        results = []
        for members in groups.values():
            group = [rows[j] for j in members]
            if self.batch_invariant:
                picked = hidden[members[0]]
            else:
                index = device_tensor(members, torch.long, hidden.device) if len(members) < len(rows) else None
                picked = hidden if index is None else hidden[index]
            states, sampler_states = [r.stop_state for r in group], [r.sampler_state for r in group]
            try:
                out = denoise_rows(self.model, group[0].plan, StepRows(
                    hidden=picked, canvas=torch.stack([r.tokens for r in group]),
                    sequences=[torch.cat([r.prompt, *r.canvases]) for r in group]
                    if group[0].plan.processors or group[0].plan.constraint is not None else [],
                    row_ids=[r.index for r in group],
                    position_offsets=[len(r.prompt) + len(r.canvases) * self.L for r in group],
                    steps_remaining=[r.steps_remaining for r in group],
                    generators=[r.generator for r in group] if group[0].plan.sampler.per_row else None,
                    stop_state=torch.cat(states) if states[0] is not None else None,
                    sampler_state=torch.cat(sampler_states) if sampler_states[0] is not None else None,
                ))
            except Exception as error:  # noqa: BLE001 - one plan's failure (its sampler, stopper, processors) fails
                # only the rows of that plan; the others' step and state are untouched
                events.faulted += [(r, error) for r in group]
                continue
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
            canvas = r.argmax
            if has_eos and r.pad_token_id is not None:
                canvas = pad_after_eos(canvas[None], r.eos_ids, r.pad_token_id)[0]
            r.canvases.append(canvas)
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
            r.phase, r.tokens = COMMIT, r.argmax


def forward_pool(model, active: list[Row], cache: RowCache, L: int) -> tuple[list[int], torch.Tensor | None, list]:
    """One forward over rows in any phase (prefill, commit, denoise), each with its own committed length in `cache`.

    Returns the slots of the denoising rows, their canvas hidden states [d, L, H] (None if none denoise), and the
    rows that ran in encoder mode (prefill or commit).
    """
    tokens = pad_sequence([r.tokens for r in active], batch_first=True)  # [n, T], zero padded
    q_lens = [len(r.tokens) for r in active]
    encoder_rows = [r.phase != DENOISE for r in active]
    soft_slots = [i for i, r in enumerate(active) if r.phase == DENOISE and r.soft is not None]
    soft = torch.stack([active[i].soft for i in soft_slots]) if soft_slots else None
    # prefill rows may carry image features (`images`: PromptImages), scattered into their placeholders
    images = stack_rows([r.images if r.phase == PREFILL else None for r in active], q_lens, tokens.shape[1])
    hidden = model.run_rows(tokens, cache, q_lens, encoder_rows, soft, soft_slots, images)  # [n, T, H]
    denoising = [i for i, r in enumerate(active) if r.phase == DENOISE]
    encoding = [r for r in active if r.phase != DENOISE]
    picked = hidden[device_tensor(denoising, torch.long, hidden.device), :L] if denoising else None  # [d, L, H]
    return denoising, picked, encoding
