"""Lock-step batching as an admission policy of the row pool (`pool.py`): all rows are admitted together and commit
together, as transformers' built-in `generate` runs a batch (spec D.4).

The pool calls `Lockstep.pass_done` after every forward (`passes.SharedForward`: one shared cache, every row in one
phase). What lock-step adds to the pool's own rules:

* a canvas starts for every row at once, with one `init_canvas` call (a global-RNG sampler draws the batch's noise
  in the built-in's order; a per-row sampler draws for the rows still running, each from its own generator);
* the rows that sample form one engine call (one `Plan`): reference mode runs every row, as the built-in draws for
  all of them, and a row whose stopper fired keeps its canvas, argmax and self-conditioning input (spec D.4.4h); a
  per-row sampler runs only the rows still denoising;
* the canvas ends for all rows together, when every stopper fired or the steps ran out; every row then commits
  (`pool.commit_canvas`, the one commit rule), a row that had finished commits pad, and the batch leaves the pool
  when every row finished (EOS, `max_length`, the user's stopping criteria) or the canvases ran out.

Host reads: one per pass (the stop and fault flags of the rows that sampled) and one per canvas (the finished
flags).

Legend: B batch, B' rows that sample, L canvas length, S' committed tokens, H hidden.
"""

import torch

from .engine import Plan
from .finite import NonFiniteLogitsError, raise_for_faults
from .passes import COMMIT, DENOISE, SharedForward
from .pool import PassEvents, PassRecord, Row, RowPool, commit_canvas, soft_of
from .sampler import init_sampler_state

__all__ = ["Lockstep"]


class Lockstep:
    """The lock-step policy over one batch of rows sharing `forward`.

    Args:
        forward: the batch's `passes.SharedForward` (its cache, padding, images, compiled pass).
        fast: the plan's sampler draws per row (rows that stopped are skipped, finished rows draw nothing).
        max_length: the generation config's `max_length` (a row whose sequence reaches it is finished), or None.
        criteria: the user's `StoppingCriteriaList`, called once per canvas over the whole batch, or None.
    """

    def __init__(self, model, plan: Plan, cache, keep, images, denoise_pass, fast: bool, max_length: int | None,
                 criteria=None):
        self.model, self.plan, self.fast = model, plan, fast
        self.max_length, self.criteria = max_length, criteria
        self.forward = SharedForward(model, cache, keep, images, denoise_pass, self.samples)

    def samples(self, r: Row) -> bool:
        """Whether row r runs the engine this pass: every row in reference mode, the rows still denoising else."""
        return not self.fast or not (r.stopped or r.done)

    def pass_done(self, pool: RowPool, out, events: PassEvents) -> None:
        if out.encoding:  # the prompt or the last canvases are in the cache: a new canvas for every row
            self.start_canvases(pool.active, pool.L)
        else:
            self.denoise(pool, pool.active, out, events)

    def start_canvases(self, rows: list[Row], L: int) -> None:
        """Spec D.4.3 for the whole batch: fresh noise canvases, the stopper's and the sampler's state fresh."""
        plan, device = self.plan, rows[0].prompt.device
        B, first = len(rows), not rows[0].canvases
        if self.fast:  # rows that finished their sequence draw nothing and stay frozen for the whole canvas
            live = [r for r in rows if not r.done]
            drawn = iter(plan.sampler.init_canvas(len(live), L, device, [r.generator for r in live])
                         if live else [])  # [B', L], RNG: each row's own generator
            canvases = [next(drawn) if not r.done else torch.zeros(L, dtype=torch.long, device=device) for r in rows]
        else:
            canvases = list(plan.sampler.init_canvas(B, L, device, None))  # RNG: canvas init, drawn even when seeded (H.9)
        stop_state = plan.stopper.init_state(B, L, device)
        sampler_state = init_sampler_state(plan.sampler, B, L, device)
        for b, r in enumerate(rows):
            r.tokens, r.soft = canvases[b], None
            if first and r.first_canvas is not None:
                r.tokens = r.first_canvas
            if first and r.first_soft is not None:
                r.soft = r.first_soft
            r.argmax, r.phase, r.steps_remaining = r.tokens, DENOISE, plan.max_steps
            r.stop_state = stop_state[b : b + 1] if stop_state is not None else None
            r.sampler_state = sampler_state[b : b + 1] if sampler_state is not None else None
            r.stopped = r.done if self.fast else False

    def denoise(self, pool: RowPool, rows: list[Row], out, events: PassEvents) -> None:
        """Spec D.4.4 for the batch: the engine step of the rows that sample, then the one host read of the pass."""
        plan = self.plan
        n, c = rows[0].steps_remaining, len(rows[0].canvases)
        step = plan.max_steps - n + 1
        frozen = [r.stopped for r in rows]  # stopped before this step (fast mode: also the finished rows)
        working = [not (r.stopped or r.done) for r in rows]
        record = None
        if pool.record:
            record = (torch.stack([r.tokens for r in rows]), soft_of(rows))
        sampled = [rows[i] for i in out.sampled]
        sequences = None
        if plan.processors or plan.constraint is not None:  # one [B', S'] tensor: processors run once, as built-in
            sequences = torch.stack([torch.cat([r.prompt, *r.canvases]) for r in sampled])
        if sampled:
            try:
                result = pool.engine_step(sampled, out.hidden, out.logits, sequences)  # b-i: no host read
            except NonFiniteLogitsError as error:  # the reference sampler's refusal: add the canvas
                raise error.at_canvas(c) from None
            stop, faults = torch.stack([result.stop.to(torch.int8), result.faults]).tolist()  # k: the host read
            raise_for_faults(faults, step, c, [r.index for r in sampled])
            for j, r in enumerate(sampled):
                r.stop_state = result.stop_state[j : j + 1] if result.stop_state is not None else None
                r.sampler_state = result.sampler_state[j : j + 1] if result.sampler_state is not None else None
                if r.stopped:  # h. reference mode: a row that stopped keeps its canvas, argmax and input
                    continue
                r.tokens, r.argmax, r.soft = result.canvas[j], result.argmax[j], result.soft[j]
                r.stopped = bool(stop[j])
            if record is not None:
                events.records.append(PassRecord(list(rows), list(out.sampled), record[0], record[1], n,
                                                 torch.tensor(working), result, frozen=torch.tensor(frozen),
                                                 canvas_index=c))
        for r, w in zip(rows, working):
            r.passes += w
            r.steps_remaining -= 1
            if w:
                events.stepped.append(r)
        events.drafts.extend((r, r.argmax[None], None) for r in rows if r.draft)  # no entropy: not a server row
        if all(r.stopped for r in rows) or n == 1:
            self.commit(pool, rows, events)

    def commit(self, pool: RowPool, rows: list[Row], events: PassEvents) -> None:
        """Spec D.4.5-6 for the batch: every row commits; finished rows leave together when all have."""
        L = pool.L
        argmax = torch.stack([r.argmax for r in rows])  # [B, L]
        eos_ids = rows[0].eos_ids
        has_eos = (torch.isin(argmax, eos_ids).any(dim=-1) if eos_ids is not None
                   else torch.zeros(len(rows), dtype=torch.bool, device=argmax.device))  # [B]
        for r in rows:  # pad after a first EOS (a no-op without one): no host read of whether there is one
            events.committed.append((r, commit_canvas(r, eos_ids is not None)))
        finished = has_eos
        width = len(rows[0].prompt) + len(rows[0].canvases) * L  # P + c*L: the committed sequence's width
        if self.max_length is not None and width >= self.max_length:
            finished = torch.ones_like(finished)
        if self.criteria:
            sequences = torch.stack([torch.cat([r.prompt, *r.canvases]) for r in rows])  # [B, S']
            finished = finished | self.criteria(sequences, None, new_token_length=L).to(finished.device)
        for r, f in zip(rows, finished.tolist()):  # the one host read of the canvas
            r.done = r.done or bool(f)
        if all(r.done for r in rows) or len(rows[0].canvases) >= rows[0].num_canvases:
            events.finished.extend(rows)
            return
        for r in rows:
            r.phase, r.tokens = COMMIT, r.canvases[-1]
