"""Mixed-phase batching for fast mode: every row runs its own block-autoregressive schedule.

Lock-step batching (`loop.py`) commits all rows together, so a row whose canvas converged waits for the slowest row,
and a finished row keeps its place in the batch. Here each row moves on as soon as it can: a converged canvas is
committed at once (an encoder pass) and the row starts its next canvas while the others keep denoising. Prefill,
commit and denoising rows share one forward (`model.run_rows`: a causal or bidirectional flag per row over a
`RowCache` with one committed length per row). A row that finished its sequence leaves the pool, and with
`max_batch_size` smaller than the batch the next waiting prompt takes its place.

Rows are independent sequences: left padding is stripped, every row draws from its own generator in the same order
as when it runs alone, so its output equals running it alone (up to float rounding between batch shapes).

Host syncs: the scheduler keeps every row's bookkeeping (phase, lengths, steps) on the host and hands it to the
forward as Python lists, so a pass reads the device once: every denoising row's stop and EOS flags in one `.tolist()`.
User stopping criteria, when given, add one more read in a pass where some canvas ends (their results for all those
rows at once).

Legend: N rows in the request batch, n rows in the pool, T tokens in a pass, L canvas length, V vocab, H hidden.
"""

import copy
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from ..modeling.cache import RowCache
from ..modeling.host import device_tensor, to_device
from ..modeling.vision import PromptImages, stack_rows
from .finite import fault_codes, model_logits_bad, processed_scores_bad, raise_for_faults
from .sampler import temperature_at
from .stopping import pad_after_eos

PREFILL, COMMIT, DENOISE = "prefill", "commit", "denoise"


@dataclass
class Row:
    """One request's progress. `tokens` is what the next pass feeds: the prompt, a canvas to commit, or the canvas
    being denoised."""

    index: int  # row in the request batch (and its generator)
    prompt: torch.Tensor  # [P_r] without padding
    phase: str = PREFILL
    tokens: torch.Tensor | None = None  # [T_r]
    argmax: torch.Tensor | None = None  # [L] argmax canvas of the latest step
    soft: torch.Tensor | None = None  # [L, H] self-conditioning input, None on a canvas' first step
    steps_remaining: int = 0
    passes: int = 0
    canvases: list = field(default_factory=list)  # committed [L] canvases
    stopper: object = None
    images: PromptImages | None = None  # [1, P_r] the prompt's image soft tokens (prefill only)


@dataclass
class MixedSettings:
    """What the schedule needs from `generate` (resolved and validated there)."""

    num_canvases: int
    max_steps: int
    t_min: float
    t_max: float
    eos_ids: torch.Tensor | None
    pad_token_id: int | None
    max_batch_size: int


def strip_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """[N, P] (+ mask) -> N prompts without their padding."""
    if attention_mask is None:
        return list(input_ids)
    return [ids[mask.bool()] for ids, mask in zip(input_ids, attention_mask)]


class MixedScheduler:
    """Runs the pool until every row finished. See the module docstring.

    Args:
        model: the `DiffusionGemmaForBlockDiffusion`.
        sampler: a `FastSampler` (one generator per request row).
        new_stopper: builds one stopper per row (they keep per-row history).
        settings: `MixedSettings`.
        processors / user_criteria: as in `generate`, called per row.
        first_canvas: optional [N, L] ids seeding each row's first canvas; first_soft: optional [N, L, H].
        images: optional `PromptImages` of the padded request batch [N, P].
    """

    def __init__(self, model, sampler, new_stopper, settings: MixedSettings, processors=None, user_criteria=None,
                 first_canvas=None, first_soft=None, images: PromptImages | None = None):
        self.model, self.sampler, self.settings = model, sampler, settings
        self.new_stopper = new_stopper
        self.processors, self.user_criteria = processors, user_criteria
        self.first_canvas, self.first_soft = first_canvas, first_soft
        self.images = images
        self.L = model.canvas_length

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [N, P] (left-padded, `attention_mask` [N, P]) -> (sequences [N, P + c*L] with each row's
        original prompt, its canvases and padding after it finished; denoising passes per row [N] int32)."""
        prompts = strip_padding(input_ids, attention_mask)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("`attention_mask` marks every token of some row as padding; each row needs a prompt")
        images = None
        if self.images is not None:  # each row's soft tokens and image runs, its padding stripped like its prompt
            images = [self.images.row(b, None if attention_mask is None else attention_mask[b])
                      for b in range(len(prompts))]
        rows = self.run(prompts, images)
        pad = self.settings.pad_token_id
        sequences = assemble(rows, input_ids, self.L, pad if pad is not None else 0)
        return sequences, torch.tensor([r.passes for r in rows], dtype=torch.int32, device=input_ids.device)

    def run(self, prompts: list[torch.Tensor], images: list[PromptImages] | None = None) -> list[Row]:
        """Generate for every prompt (`images`: one `PromptImages` [1, P_r] per prompt, or None); returns the finished
        rows in request order."""
        s, L = self.settings, self.L
        device = prompts[0].device
        longest = max(len(p) for p in prompts)
        pool = min(s.max_batch_size, len(prompts))
        # room per row: its prompt and canvases, plus padding queries of a pass as long as the longest prompt
        capacity = longest + s.num_canvases * L + max(longest, L)
        cache = RowCache(self.model.get_decoder().shapes, pool, capacity, device)
        waiting = [Row(i, p, tokens=p, images=images[i] if images else None) for i, p in enumerate(prompts)]
        waiting.reverse()  # pop() takes the first request
        active: list[Row] = []
        done: list[Row] = []
        while waiting or active:
            while waiting and len(active) < pool:  # free slots take the next prompts
                cache.reset(len(active))
                active.append(waiting.pop())
            leaving = self._pass(active, cache)
            for slot in sorted(leaving, reverse=True):  # compact: the last row moves into the freed slot
                done.append(active[slot])
                last = len(active) - 1
                if slot != last:
                    cache.move(last, slot)
                    active[slot] = active[last]
                active.pop()
        return sorted(done, key=lambda r: r.index)

    def _pass(self, active: list[Row], cache: RowCache) -> list[int]:
        """One shared forward over the pool, then every row's transition. Returns the slots of rows that finished."""
        denoising, picked, encoding = forward_pool(self.model, active, cache, self.L)
        leaving = []
        if denoising:
            leaving = self._denoise_step([active[i] for i in denoising], picked, denoising)
        for r in encoding:  # prefill or commit done: the next canvas starts
            self._start_canvas(r)
        return leaving

    def _start_canvas(self, r: Row) -> None:
        s = self.settings
        r.tokens = rows_view(self.sampler, [r.index]).init_canvas(1, self.L, r.prompt.device)[0]  # RNG: canvas init
        r.soft = None
        if not r.canvases and self.first_canvas is not None:
            r.tokens = self.first_canvas[r.index]
        if not r.canvases and self.first_soft is not None:
            r.soft = self.first_soft[r.index]
        r.argmax = r.tokens
        r.phase, r.steps_remaining = DENOISE, s.max_steps
        r.stopper = self.new_stopper()
        r.stopper.reset(1)

    def _denoise_step(self, rows: list[Row], hidden: torch.Tensor, slots: list[int]) -> list[int]:
        """LM head, temperature, sampler and stopping for the denoising rows; hidden [d, L, H]."""
        s, stack = self.settings, self.model.get_decoder()
        logits = self.model.head(hidden)  # [d, L, V] fp32
        model_bad, processors_bad, empty = model_logits_bad(logits), None, None  # [d] each (finite.py)
        if self.processors:
            for j, r in enumerate(rows):
                seen = torch.cat([r.prompt, *r.canvases])[None]
                step = torch.tensor(r.steps_remaining, dtype=torch.int32)
                scores = self.processors(seen, logits[j : j + 1], cur_step=step)
                processed_scores_bad(scores, logits[j : j + 1].shape)  # None or a wrong shape: a clear error
                logits[j : j + 1] = scores
            processors_bad, empty = processed_scores_bad(logits, logits.shape)
        temperature = torch.stack([temperature_at(r.steps_remaining, s.max_steps, s.t_min, s.t_max) for r in rows])
        logits.div_(to_device(temperature, logits.device)[:, None, None])  # [d] fp32, computed on the host
        out = rows_view(self.sampler, [r.index for r in rows]).step(logits, None, stack.embed_tokens.soft)
        stop = torch.cat([r.stopper(out.argmax[j : j + 1], out.entropy[j : j + 1]) for j, r in enumerate(rows)])
        has_eos = torch.isin(out.argmax, s.eos_ids).any(dim=-1) if s.eos_ids is not None else torch.zeros_like(stop)
        empty = out.entropy.isnan().any(dim=-1) if empty is None else empty | out.entropy.isnan().any(dim=-1)
        faults = fault_codes(model_bad, processors_bad, empty)  # [d] int8
        stop_flags, eos_flags, fault_flags = torch.stack(  # [3, d]: the one host read of this pass
            [stop.to(torch.int8), has_eos.to(torch.int8), faults]).tolist()
        for j, r in enumerate(rows):  # name the first faulty row's step and canvas
            raise_for_faults([fault_flags[j]], s.max_steps - r.steps_remaining + 1, len(r.canvases), [r.index])
        ending = []  # (row, slot) whose canvas is done
        for j, (r, slot) in enumerate(zip(rows, slots)):
            r.tokens, r.argmax, r.soft = out.canvas[j], out.argmax[j], out.soft[j]
            r.passes += 1
            r.steps_remaining -= 1
            if stop_flags[j] or r.steps_remaining == 0:
                ending.append((r, slot, eos_flags[j]))
        return self._finish_canvases(ending)

    def _finish_canvases(self, ending: list) -> list[int]:
        """Append each ending row's argmax canvas; a row whose sequence is not done commits that canvas next pass.
        ending: (row, slot, canvas has EOS) triples. Returns the slots of the rows whose sequence is done."""
        s = self.settings
        undecided, leaving = [], []
        for r, slot, has_eos in ending:
            canvas = r.argmax
            finished = len(r.canvases) + 1 >= s.num_canvases or has_eos
            if has_eos and s.pad_token_id is not None:
                canvas = pad_after_eos(canvas[None], s.eos_ids, s.pad_token_id)[0]
            r.canvases.append(canvas)
            if finished:
                leaving.append(slot)
            else:
                undecided.append((r, slot))
        if self.user_criteria and undecided:  # one read for all of them
            verdicts = [self.user_criteria(torch.cat([r.prompt, *r.canvases])[None], None, new_token_length=self.L)
                        for r, _ in undecided]
            stops = torch.cat([v.reshape(-1)[:1].to(verdicts[0].device) for v in verdicts]).tolist()
            leaving += [slot for (_, slot), stop in zip(undecided, stops) if stop]
            undecided = [(r, slot) for (r, slot), stop in zip(undecided, stops) if not stop]
        for r, _ in undecided:
            r.phase, r.tokens = COMMIT, r.argmax
        return sorted(leaving)


def forward_pool(model, active: list, cache: RowCache, L: int) -> tuple[list[int], torch.Tensor | None, list]:
    """One forward over rows in any phase (prefill, commit, denoise), each with its own committed length in `cache`.

    `active` rows carry `tokens` (their query tokens), `phase`, `soft` (self-conditioning logits or None) and
    optionally `images` (a prefill row's `PromptImages`).
    Returns the slots of the denoising rows, their canvas hidden states [d, L, H] (None if none denoise), and the
    rows that ran in encoder mode (prefill or commit).
    """
    tokens = pad_sequence([r.tokens for r in active], batch_first=True)  # [n, T], zero padded
    q_lens = [len(r.tokens) for r in active]
    encoder_rows = [r.phase != DENOISE for r in active]
    soft_slots = [i for i, r in enumerate(active) if r.phase == DENOISE and r.soft is not None]
    soft = torch.stack([active[i].soft for i in soft_slots]) if soft_slots else None
    # prefill rows may carry image features (`images`: PromptImages), scattered into their placeholders
    images = stack_rows([getattr(r, "images", None) if r.phase == PREFILL else None for r in active], q_lens,
                        tokens.shape[1])
    hidden = model.run_rows(tokens, cache, q_lens, encoder_rows, soft, soft_slots, images)  # [n, T, H]
    denoising = [i for i, r in enumerate(active) if r.phase == DENOISE]
    encoding = [r for r in active if r.phase != DENOISE]
    picked = hidden[device_tensor(denoising, torch.long, hidden.device), :L] if denoising else None  # [d, L, H]
    return denoising, picked, encoding


def rows_view(sampler, rows: list[int]):
    """The fast sampler restricted to request rows `rows`: their generators, in that order, drawn with `rows=None`.

    Equivalent to `sampler.step(..., rows=torch.tensor(rows))`, without an index tensor the sampler would read back
    with `.tolist()`.
    """
    view = copy.copy(sampler)
    view.generators = [sampler.generators[i] for i in rows]
    return view


def assemble(rows: list[Row], input_ids: torch.Tensor, canvas_length: int, fill: int) -> torch.Tensor:
    """[N, P + c*L]: each row's original (padded) prompt, its canvases, then `fill` up to the longest row."""
    most = max(len(r.canvases) for r in rows)
    out = input_ids.new_full((len(rows), input_ids.shape[1] + most * canvas_length), fill)
    out[:, : input_ids.shape[1]] = input_ids
    for r in rows:
        if r.canvases:
            out[r.index, input_ids.shape[1] : input_ids.shape[1] + len(r.canvases) * canvas_length] = torch.cat(
                r.canvases)
    return out
