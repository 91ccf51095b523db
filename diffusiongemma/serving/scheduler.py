"""The server's scheduler: requests join the row pool (`generation/pool.py`) at pass boundaries from any thread,
and leave it when they finish, fail, are cancelled, or hit a stop string.

The pool, the one denoising step and the plug-ins are generation's; this file adds only the server's policy: a
bounded waiting queue, one background thread that runs the passes, each request's `Plan` (sampler, stopper,
temperature schedule: requests with equal settings share one, so they sample in one call), and streaming:

    loop: admit waiting requests into free slots -> drop abandoned rows -> one pool pass -> stream its events

A row draws only from its own `torch.Generator` (seeded from the request's `seed`), in the order it draws when run
alone. With `batch_invariant` every row also runs its own forward and engine step inside each pass, so its logits
and tokens never depend on the other requests. Requests whose sampler draws from the global RNG (sampling "reference", "gumbel") run alone, through
`model.generate`, between two passes (the pool waits).

With `compile` (`diffusiongemma serve --compile`) every denoising pass of the pool runs through the fixed-shape
compiled pass of its row bucket (`passes.RowForward`, `modeling.compile.RowDenoisePass`) against a capacity bucket
fixed at startup (`max_model_len` slots), so concurrent requests arriving and leaving compile at most one graph per
row bucket (1, 2, 4, ... up to `max_batch_size`).

Legend: P prompt, L canvas length.
"""

import collections
import threading
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList
from transformers.utils import logging

from ..generation.engine import Plan
from ..generation.options import compile_options
from ..generation.plan import build_plan
from ..generation.pool import Row, RowPool
from .drafts import draft_confidence
from .settings import RequestSettings

logger = logging.get_logger(__name__)


MAX_CONSTRAINED_PLANS = 16


class QueueFull(RuntimeError):
    """The waiting queue holds `max_queue` requests already (the server answers 429)."""


@dataclass
class Job:
    """One request handed to the scheduler."""

    prompt: torch.Tensor  # [P] on the model's device
    settings: RequestSettings
    streamer: object  # a `RowStreamer`: put / put_draft / end / fail / abandoned


class ServingScheduler:
    """Runs the model on one background thread for every request of the server.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion` (eval mode).
        max_batch_size: rows per pass (pool slots).
        max_queue: requests waiting for a slot before `submit` raises `QueueFull`.
        max_model_len: most tokens a request holds (prompt + whole canvases); `RowCache` room per row.
        logits_processor: transformers `LogitsProcessor`s applied to every request's steps, as `generate` applies
            them (per-position processors get the canvas, the request's row id and its position offset).
        batch_invariant: every row runs alone inside each pass (`generation/invariant.py`): a seeded request's
            tokens are bit-identical to `model.generate(prompt, seed=seed, batch_invariant=True, ...)`, whatever
            else the server runs and whenever the request arrives.
        compile: True or a dict of `torch.compile` options (mode, backend), as `generate`'s `compile`: denoising
            passes run compiled (module docstring); refused with `batch_invariant`.
    """

    def __init__(self, model, max_batch_size: int = 8, max_queue: int = 64, max_model_len: int = 4096,
                 logits_processor=None, batch_invariant: bool = False, compile: bool | dict = False):
        self.model, self.L = model, model.canvas_length
        self.V = model.config.text_config.vocab_size
        self.max_batch_size, self.max_queue = max_batch_size, max_queue
        self.requested_max_model_len = max_model_len  # as given (--max-model-len); error messages name it
        if not isinstance(batch_invariant, bool):
            raise TypeError(f"`batch_invariant` must be a bool, got {batch_invariant!r}")
        self.batch_invariant = batch_invariant
        self.compile = compile_options(compile)  # None: eager
        if self.compile is not None and batch_invariant:
            raise ValueError("`compile` cannot run with `batch_invariant`: every row runs alone at the shapes of its "
                             "solo run, which a pass fixed per row bucket would change")
        self.max_model_len = min(max_model_len, model.config.text_config.max_position_embeddings)
        self.device = model.device
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.peak_rows = 0  # most rows that shared one pass (observability, tests)
        self.passes = 0
        self.active_rows = 0  # rows in the pool now
        self.dropped = 0  # requests that left unfinished (client gone, while waiting or running; stop string)
        self._pool: RowPool | None = None
        self._plans: dict = {}  # request settings -> Plan, shared by requests with equal settings
        self._constrained: collections.deque = collections.deque()  # keys of plans with a constraint, oldest first
        self._requests = 0
        self.processors = LogitsProcessorList(logits_processor) if logits_processor else None
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
        with torch.no_grad():  # grad mode is per thread
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not (self._pool and len(self._pool)):
                        self._cond.wait()
                    if self._stopping:
                        break
                    admitted = []
                    while self._waiting and self.active_rows + len(admitted) < self.max_batch_size:
                        admitted.append(self._waiting.popleft())
                pool = self._ensure_pool()
                for job in admitted:
                    if job.streamer.abandoned:  # its client left while it waited: dropped before it ran
                        self.dropped += 1
                        job.streamer.end()
                        continue
                    try:
                        alone = not self._plan(job.settings).sampler.per_row
                    except Exception as error:  # noqa: BLE001 - this request fails, the server goes on
                        logger.error(f"preparing a request failed: {error}", exc_info=True)
                        job.streamer.fail(f"generation failed: {error}")
                        continue
                    if alone:
                        self._run_alone(job)
                        continue
                    try:
                        self._admit(job, pool)
                    except Exception as error:  # noqa: BLE001 - this request fails, the server goes on
                        logger.error(f"admitting a request failed: {error}", exc_info=True)
                        job.streamer.fail(f"generation failed: {error}")
                abandoned = [r for r in pool.active if r.owner.streamer.abandoned]
                self.dropped += len(abandoned)
                self._leave(abandoned)
                self.active_rows = len(pool)
                if not len(pool):
                    continue
                try:
                    self.peak_rows = max(self.peak_rows, len(pool))
                    events = pool.step()
                    self.passes += 1
                except Exception as error:  # noqa: BLE001 - a failed pass fails its rows, never the server
                    logger.error(f"pass failed: {error}", exc_info=True)
                    for r in pool.active:
                        r.owner.streamer.fail(f"generation failed: {error}")
                    self._pool = None
                    self.active_rows = 0
                    continue
                self._stream(events)
                self.active_rows = len(pool)
            for r in self._pool.active if self._pool is not None else []:  # unfinished: say so, never a short answer
                r.owner.streamer.fail("the server is shutting down")
            for job in self._waiting:
                job.streamer.fail("the server is shutting down")

    def _ensure_pool(self) -> RowPool:
        if self._pool is None:
            # room per row: the longest request, plus padding queries of a pass as long as the longest prompt
            capacity = self.max_model_len + max(self.max_model_len - self.L, self.L)
            self._pool = RowPool(self.model, self.max_batch_size, capacity, self.device,
                                 stop_after_canvas=lambda rows: [r.owner.streamer.abandoned for r in rows],
                                 batch_invariant=self.batch_invariant, compile=self.compile,
                                 denoise_capacity=self.max_model_len)  # the capacity bucket: fixed at startup
        return self._pool

    def _plan(self, s: RequestSettings) -> Plan:
        """The request's plan, shared with every request of equal settings (so their rows sample in one call)."""
        c = s.config
        key = (s.sampling, repr(c.sampler_config), c.max_denoising_steps, c.t_min, c.t_max, c.stability_threshold,
               c.confidence_threshold, repr(c.stopper_config))
        if s.automaton is not None:  # one guide per constraint and budget; it keeps each row's state by its id
            key += (id(s.automaton), s.max_new_tokens)
        if key not in self._plans:
            self._plans[key] = build_plan(self.model, c, s.sampling, self.device, self.processors, s.automaton,
                                          s.max_new_tokens)
            if s.automaton is not None:  # keep the last few: every distinct schema would otherwise stay forever
                self._constrained.append(key)
                if len(self._constrained) > MAX_CONSTRAINED_PLANS:
                    del self._plans[self._constrained.popleft()]  # rows still running keep their own reference
        return self._plans[key]

    def _admit(self, job: Job, pool: RowPool) -> None:
        s = job.settings
        eos = s.config.eos_token_id
        eos_ids = (torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos], device=self.device)
                   if eos is not None else None)
        seed = s.seed if s.seed is not None else int(torch.randint(0, 2**32, ()).item())
        generator = torch.Generator(device=self.device).manual_seed(seed)  # as generate(seed=seed) for one row
        self._requests += 1
        pool.admit(Row(index=self._requests, prompt=job.prompt, plan=self._plan(s), generator=generator,
                       num_canvases=-(-s.max_new_tokens // self.L), eos_ids=eos_ids,
                       pad_token_id=s.config.pad_token_id, draft=bool(job.streamer.drafts), owner=job))
        job.streamer.put(job.prompt[None].cpu())

    def _leave(self, rows: list[Row]) -> None:
        """Take rows out of the pool and end their streams."""
        self._pool.remove(rows)
        for r in rows:
            r.owner.streamer.end()
            if r.plan.constraint is not None:
                r.plan.constraint.forget(r.index)

    def _stream(self, events) -> None:
        """A pass's events to the requests' streams: drafts, committed canvases, failures, ends."""
        drafted = {id(r) for r, _, _ in events.drafts}
        for r, draft, entropy in events.drafts:
            if r.owner.settings.draft.confidence:
                r.owner.streamer.put_draft(value=draft, confidence=draft_confidence(entropy, self.V))
            else:
                r.owner.streamer.put_draft(value=draft)
        for r in events.stepped:
            if id(r) not in drafted:
                r.owner.streamer.step += 1
        for r, canvas in events.committed:
            r.owner.streamer.put(canvas[None].cpu())
        for r, error in events.faulted:
            r.owner.streamer.fail(str(error))
        for r in events.finished:
            r.owner.streamer.end()
        for r in events.finished + [r for r, _ in events.faulted]:
            if r.plan.constraint is not None:
                r.plan.constraint.forget(r.index)

    def _run_alone(self, job: Job) -> None:
        """A request with global-RNG sampling: `model.generate` on this thread, the pool paused."""
        from transformers.cli.serving.utils import _GenerationCancelled

        s = job.settings
        if s.seed is not None:
            torch.manual_seed(s.seed)
        job.streamer.raise_on_cancel = True
        try:
            self.model.generate(job.prompt[None], generation_config=s.config, sampling=s.sampling,
                                streamer=job.streamer, max_new_tokens=s.max_new_tokens,
                                logits_processor=self.processors, constraint=s.constraint,
                                tokenizer=s.tokenizer if s.constraint is not None else None,
                                compile=self.compile or False)  # one row: the lock-step compiled pass
        except _GenerationCancelled:
            job.streamer.end()
        except Exception as error:  # noqa: BLE001 - the request fails, the server goes on
            job.streamer.fail(f"generation failed: {error}")
