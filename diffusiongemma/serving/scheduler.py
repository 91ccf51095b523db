"""Open-ended mixed-phase batching for the server: requests join the running pool at step boundaries and leave it
when they finish, are cancelled, or hit a stop string.

`generation/mixed.py` schedules one `generate` call's fixed batch with one set of settings. A server needs rows that
arrive while others run, each with its own settings (steps, temperatures, entropy bound, stopper, length). This file
runs the same passes with the same building blocks (`Row`, `model.run_rows` over a `RowCache`, the LM head, the fast
sampler's per-row generators, `StableAndConfidentStopper`), with the settings looked up per row:

    loop: admit waiting requests into free slots -> drop abandoned rows -> one shared forward -> every row's step

A row draws only from its own `torch.Generator` (seeded from the request's `seed`), in the order it draws when run
alone, so its tokens equal `model.generate(prompt, sampling="fast", seed=seed, ...)` whatever else shares the pass.
Requests with `sampling` other than "fast" draw from the global RNG like the built-in class: they run alone, through
`model.generate`, between two passes (the pool waits).

Legend: n rows in the pool, d denoising rows, T tokens in a pass, P prompt, L canvas length, V vocab, H hidden.
"""

import collections
import threading
from dataclasses import dataclass

import torch
from transformers.utils import logging

from ..generation.fast_sampler import FastSampler
from ..generation.finite import NonFiniteLogitsError, fault_codes, model_logits_bad, raise_for_faults
from ..generation.mixed import COMMIT, DENOISE, Row, forward_pool
from ..generation.sampler import temperature_at
from ..generation.stopping import StableAndConfidentStopper, pad_after_eos
from ..modeling.cache import RowCache
from ..modeling.host import to_device
from .settings import RequestSettings

logger = logging.get_logger(__name__)


class QueueFull(RuntimeError):
    """The waiting queue holds `max_queue` requests already (the server answers 429)."""


@dataclass
class Job:
    """One request handed to the scheduler."""

    prompt: torch.Tensor  # [P] on the model's device
    settings: RequestSettings
    streamer: object  # a `RowStreamer`: put / put_draft / end / fail / abandoned


@dataclass
class ServedRow(Row):
    """A `Row` with its request (settings, generator, streamer)."""

    job: Job | None = None
    generator: torch.Generator | None = None
    eos_ids: torch.Tensor | None = None  # [E]
    num_canvases: int = 0


class ServingScheduler:
    """Runs the model on one background thread for every request of the server.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion` (eval mode).
        max_batch_size: rows per pass (pool slots).
        max_queue: requests waiting for a slot before `submit` raises `QueueFull`.
        max_model_len: most tokens a request holds (prompt + whole canvases); `RowCache` room per row.
    """

    def __init__(self, model, max_batch_size: int = 8, max_queue: int = 64, max_model_len: int = 4096):
        self.model, self.L = model, model.canvas_length
        self.V = model.config.text_config.vocab_size
        self.max_batch_size, self.max_queue = max_batch_size, max_queue
        self.max_model_len = min(max_model_len, model.config.text_config.max_position_embeddings)
        self.device = model.device
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.peak_rows = 0  # most rows that shared one pass (observability, tests)
        self.passes = 0
        self.active_rows = 0  # rows in the pool now
        self.dropped = 0  # rows that left unfinished (client gone, stop string)
        self._cache = None
        self._thread = threading.Thread(target=self._run, name="diffusiongemma-scheduler", daemon=True)
        self._thread.start()

    # ----- the request side (any thread) -----

    def submit(self, job: Job) -> None:
        """Queue a request; it joins the pool at the next step boundary with a free slot."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the scheduler is shut down")
            if len(self._waiting) >= self.max_queue:  # clients that left while waiting free their places first
                for gone in [j for j in self._waiting if j.streamer.abandoned]:
                    self._waiting.remove(gone)
                    gone.streamer.end()
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting already (--max-queue {self.max_queue})")
            self._waiting.append(job)
            self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=10)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ----- the model side (the scheduler thread) -----

    def _run(self) -> None:
        active: list[ServedRow] = []
        with torch.no_grad():  # grad mode is per thread
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not active:
                        self._cond.wait()
                    if self._stopping:
                        break
                    admitted = []
                    while self._waiting and len(active) + len(admitted) < self.max_batch_size:
                        admitted.append(self._waiting.popleft())
                for job in admitted:
                    if job.streamer.abandoned:
                        job.streamer.end()
                    elif job.settings.sampling != "fast":
                        self._run_alone(job)
                    else:
                        try:
                            self._admit(job, active)
                        except Exception as error:  # noqa: BLE001 - this request fails, the server goes on
                            logger.error(f"admitting a request failed: {error}", exc_info=True)
                            job.streamer.fail(f"generation failed: {error}")
                abandoned = [i for i, r in enumerate(active) if r.job.streamer.abandoned]
                self.dropped += len(abandoned)
                self._leave(active, abandoned)
                self.active_rows = len(active)
                if not active:
                    continue
                try:
                    finished = self._pass(active)
                except Exception as error:  # noqa: BLE001 - a failed pass fails its rows, never the server
                    logger.error(f"pass failed: {error}", exc_info=True)
                    for r in active:
                        r.job.streamer.fail(f"generation failed: {error}")
                    active.clear()
                    self.active_rows = 0
                    self._cache = None
                    continue
                self._leave(active, finished)
                self.active_rows = len(active)
            for r in active:
                r.job.streamer.end()
            for job in self._waiting:
                job.streamer.end()

    def _ensure_cache(self) -> RowCache:
        if self._cache is None:
            # room per row: the longest request, plus padding queries of a pass as long as the longest prompt
            capacity = self.max_model_len + max(self.max_model_len - self.L, self.L)
            self._cache = RowCache(self.model.get_decoder().shapes, self.max_batch_size, capacity, self.device)
        return self._cache

    def _admit(self, job: Job, active: list[ServedRow]) -> None:
        cache = self._ensure_cache()
        s = job.settings
        cache.reset(len(active))
        eos = s.config.eos_token_id
        eos_ids = (torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=self.device)
                   if eos is not None else None)
        seed = s.seed if s.seed is not None else int(torch.randint(0, 2**62, ()).item())
        generator = torch.Generator(device=self.device).manual_seed(seed)  # as generate(seed=seed) for one row
        num_canvases = -(-s.max_new_tokens // self.L)
        active.append(ServedRow(index=0, prompt=job.prompt, tokens=job.prompt, job=job, generator=generator,
                                eos_ids=eos_ids, num_canvases=num_canvases))
        job.streamer.put(job.prompt[None].cpu())

    def _leave(self, active: list[ServedRow], slots: list[int]) -> None:
        """Remove rows `slots` (compacting the pool: the last row moves into a freed slot) and end their streams."""
        for slot in sorted(slots, reverse=True):
            active[slot].job.streamer.end()
            last = len(active) - 1
            if slot != last:
                self._cache.move(last, slot)
                active[slot] = active[last]
            active.pop()

    def _pass(self, active: list[ServedRow]) -> list[int]:
        """One shared forward over the pool, then every row's transition. Returns the slots of finished rows."""
        denoising, picked, encoding = forward_pool(self.model, active, self._cache, self.L)
        self.passes += 1
        self.peak_rows = max(self.peak_rows, len(active))
        finished = []
        if denoising:
            finished = self._denoise_step([active[i] for i in denoising], picked, denoising)
        for r in encoding:  # prefill or commit done: the next canvas starts
            self._start_canvas(r)
        return finished

    def _start_canvas(self, r: ServedRow) -> None:
        s = r.job.settings.config
        sampler = FastSampler(0.0, self.V, [r.generator])
        r.tokens = sampler.init_canvas(1, self.L, r.prompt.device)[0]  # RNG: canvas init, as generate draws it
        r.argmax, r.soft = r.tokens, None
        r.phase, r.steps_remaining = DENOISE, s.max_denoising_steps
        r.stopper = StableAndConfidentStopper(s.stability_threshold, s.confidence_threshold)
        r.stopper.reset(1)

    def _denoise_step(self, rows: list[ServedRow], hidden: torch.Tensor, slots: list[int]) -> list[int]:
        """LM head, each row's temperature, the sampler and each row's stopper; hidden [d, L, H]."""
        stack = self.model.get_decoder()
        configs = [r.job.settings.config for r in rows]
        logits = self.model.head(hidden)  # [d, L, V] fp32
        model_bad = model_logits_bad(logits)  # [d]
        temperature = torch.stack([temperature_at(r.steps_remaining, c.max_denoising_steps, c.t_min, c.t_max)
                                   for r, c in zip(rows, configs)])  # [d] fp32, on the host
        logits.div_(to_device(temperature, logits.device)[:, None, None])
        # per-row acceptance budgets [d, 1], fp32 as the float bound is in `entropy_bound_accept`'s comparison
        bounds = torch.tensor([[c.sampler_config.entropy_bound] for c in configs], dtype=torch.float32)
        sampler = FastSampler(to_device(bounds, logits.device), self.V, [r.generator for r in rows])
        out = sampler.step(logits, None, stack.embed_tokens.soft)
        stop = torch.cat([r.stopper(out.argmax[j : j + 1], out.entropy[j : j + 1]) for j, r in enumerate(rows)])
        has_eos = torch.stack([torch.isin(out.argmax[j], r.eos_ids).any() if r.eos_ids is not None
                               else torch.zeros((), dtype=torch.bool, device=logits.device)
                               for j, r in enumerate(rows)])
        faults = fault_codes(model_bad, None, out.entropy.isnan().any(dim=-1))
        stop_flags, eos_flags, fault_flags = torch.stack(  # [3, d]: the one host read of this pass
            [stop.to(torch.int8), has_eos.to(torch.int8), faults]).tolist()
        drafting = [j for j, r in enumerate(rows) if r.job.streamer.drafts]
        drafts = out.argmax[drafting].cpu() if drafting else None  # [d', L]
        finished, ending = [], []
        for j, (r, slot) in enumerate(zip(rows, slots)):
            try:
                raise_for_faults([fault_flags[j]], configs[j].max_denoising_steps - r.steps_remaining + 1,
                                 len(r.canvases))
            except NonFiniteLogitsError as error:
                r.job.streamer.fail(str(error))
                finished.append(slot)
                continue
            r.tokens, r.argmax, r.soft = out.canvas[j], out.argmax[j], out.soft[j]
            r.passes += 1
            r.steps_remaining -= 1
            if j in drafting:
                r.job.streamer.put_draft(value=drafts[drafting.index(j)][None])
            else:
                r.job.streamer.step += 1
            if stop_flags[j] or r.steps_remaining == 0:
                ending.append((r, slot, eos_flags[j]))
        return sorted(finished + self._finish_canvases(ending))

    def _finish_canvases(self, ending: list) -> list[int]:
        """Commit each ending row's argmax canvas to its stream; a row not done commits it to the cache next pass.
        ending: (row, slot, canvas has EOS) triples. Returns the slots of rows whose response is done."""
        finished = []
        for r, slot, has_eos in ending:
            pad = r.job.settings.config.pad_token_id
            canvas = r.argmax
            if has_eos and pad is not None:
                canvas = pad_after_eos(canvas[None], r.eos_ids, pad)[0]
            r.canvases.append(canvas)
            r.job.streamer.put(canvas[None].cpu())
            if has_eos or len(r.canvases) >= r.num_canvases or r.job.streamer.abandoned:
                finished.append(slot)
            else:
                r.phase, r.tokens = COMMIT, r.argmax
        return finished

    def _run_alone(self, job: Job) -> None:
        """A request with global-RNG sampling: `model.generate` on this thread, the pool paused."""
        from transformers.cli.serving.utils import _GenerationCancelled

        s = job.settings
        if s.seed is not None:
            torch.manual_seed(s.seed)
        job.streamer.raise_on_cancel = True
        try:
            self.model.generate(job.prompt[None], generation_config=s.config, sampling=s.sampling,
                                streamer=job.streamer, max_new_tokens=s.max_new_tokens)
        except _GenerationCancelled:
            job.streamer.end()
        except Exception as error:  # noqa: BLE001 - the request fails, the server goes on
            job.streamer.fail(f"generation failed: {error}")
