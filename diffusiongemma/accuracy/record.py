"""Record a `Trace` while `generate` runs: an observer of the row pool's pass events (`observe`), then `finish`
once. Only built when `return_trace=True`, so generation without a trace does no recording work.

Lock-step batching: one record per engine call, every row of the batch in it. Mixed batching (and batch-invariant):
rows are at different canvases and steps in one pass, so each row's step is a record of its own, [1, ...] wide, with
its row in `row_index` (docs/trace-format.md, "Mixed batching"); `finish` orders the records by row, then canvas and
step, so each row reads as a one-row lock-step trace.

Legend: B batch, B' rows that ran a step (fast mode), P prompt, L canvas length, V vocab, k top-k width.
"""

import hashlib
import json

import torch

from ..version import __version__
from .format import FORMAT_NAME, FORMAT_VERSION, Trace


def top_k_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (ids [..., k] int32, log-probabilities [..., k] fp32), most likely first.

    Example: logits [0, ln 3] -> p = (1/4, 3/4); k = 1 -> ids [1], log-probs [ln 0.75 = -0.2877].
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(k, dim=-1)
    return ids.to(torch.int32), values


def drawn_tokens(result, sampled: list[int], B: int, device) -> dict[str, torch.Tensor]:
    """The optional `draw_ids` / `draw_logprobs` records [1, B, L] (docs/trace-format.md): each position's drawn token
    and its log-probability under the step's tempered distribution (rows that did not run: id 0, log-prob 0)."""
    drawn = result.drawn.long()  # [B', L]
    logprobs = torch.log_softmax(result.logits.float(), dim=-1).gather(-1, drawn[..., None])[..., 0]  # [B', L]
    ids = drawn.to(torch.int32)
    if len(sampled) < B:
        index = torch.tensor(sampled, device=device)
        ids = torch.zeros(B, ids.shape[1], dtype=ids.dtype, device=device).index_copy(0, index, ids)
        logprobs = torch.zeros(B, ids.shape[1], device=device).index_copy(0, index, logprobs)
    return {"draw_ids": ids[None], "draw_logprobs": logprobs[None]}


def config_hash(config) -> str:
    """sha256 of the model config as sorted JSON, without private keys (`_name_or_path`, ...) and the
    transformers version, so two copies of one checkpoint hash alike."""
    def clean(d):
        return {k: clean(v) if isinstance(v, dict) else v for k, v in d.items()
                if not str(k).startswith("_") and k != "transformers_version"}

    text = json.dumps(clean(config.to_dict()), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def versions() -> dict:
    import transformers

    return {"diffusiongemma": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def run_manifest(model, run) -> dict:
    """Everything needed to reproduce and judge a run (docs/trace-format.md, manifest)."""
    config = run.config
    generators = run.generators
    settings = {k: v for k, v in config.to_dict().items() if not str(k).startswith("_") and k != "transformers_version"}
    settings["sampler_config"] = config.sampler_config.to_dict()  # its fields and `_cls_name`
    if getattr(config, "stopper_config", None) is not None:  # a plug-in stopper (None: the built-in, from the fields)
        settings["stopper_config"] = config.stopper_config.to_dict()
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "model": {"path": getattr(model.config, "_name_or_path", "") or "", "config_sha256": config_hash(model.config)},
        "vocab_size": model.config.text_config.vocab_size,
        "canvas_length": model.canvas_length,
        "prompt_length": int(run.input_ids.shape[1]),
        "batch_size": int(run.input_ids.shape[0]),
        "num_canvases": run.num_canvases,
        "dtype": str(model.get_decoder().embed_tokens.weight.dtype).removeprefix("torch."),
        "device": str(run.input_ids.device),
        "attention_backend": model.attention_backend,
        "sampling": run.sampling,
        "decoder_window": model.get_decoder().decoder_window,
        "batching": run.batching,
        "batch_invariant": run.options.mode == "invariant",
        # reference mode draws from the global RNG: the seed it was last seeded with (torch.manual_seed)
        "seed": None if run.fast else torch.initial_seed(),
        "row_seeds": [g.initial_seed() for g in generators] if generators is not None else None,
        "top_k": run.trace_top_k,
        "sc_embedding": run.trace_sc_embedding,
        "generation_config": settings,
        "logits_processors": [type(p).__name__ for p in run.processors] if run.processors else [],
        "seeded_first_canvas": run.decoder_input_ids is not None,
        "seeded_self_conditioning": run.self_conditioning_logits is not None,  # canvas 0, step 0 has an input
        "versions": versions(),
        "prompts": None,  # text, filled in by callers that have a tokenizer (the CLI)
    }


class TraceRecorder:
    """Collects one record per (canvas, step) on the CPU."""

    def __init__(self, model, run):
        self.run = run
        self.k = min(run.trace_top_k, model.config.text_config.vocab_size)
        self.hidden = model.config.text_config.hidden_size
        self.manifest = run_manifest(model, run)
        self.records: dict[str, list[torch.Tensor]] = {}
        self.canvas = self.step = 0
        self.sc_ids = self.sc_logprobs = self.sc_present = None
        self.mixed = run.batching == "mixed"
        self.row_sc: dict[int, tuple] = {}  # mixed: row -> its self-conditioning top-k (ids, log-probs) [1, L, k]

    def _add(self, **tensors: torch.Tensor) -> None:
        for name, value in tensors.items():
            self.records.setdefault(name, []).append(value.detach().cpu())

    def observe(self, events) -> None:
        """An observer of the pool's pass events (`pool.PassEvents`): one record per engine call (lock-step), one
        per row and engine call (mixed)."""
        for record in events.records:
            if self.mixed:
                for j in range(len(record.rows)):
                    self.record_row(record, j)
                continue
            if record.steps_remaining == self.run.config.max_denoising_steps:  # the first step of a canvas
                self.begin_canvas(record, record.canvas_index)
            self.record_step(record)

    def begin_canvas(self, record, c: int) -> None:
        """A new canvas: no self-conditioning yet, except a caller's `self_conditioning_logits` on canvas 0."""
        B, L = record.canvas.shape
        device = record.canvas.device
        self.canvas, self.step = c, 0
        self.sc_ids = torch.zeros(B, L, self.k, dtype=torch.int32, device=device)
        self.sc_logprobs = torch.zeros(B, L, self.k, device=device)
        self.sc_present = torch.zeros(B, dtype=torch.bool, device=device)
        if c == 0 and self.run.self_conditioning_logits is not None:
            self.sc_ids, self.sc_logprobs = top_k_logprobs(self.run.self_conditioning_logits, self.k)
            self.sc_present = torch.ones_like(self.sc_present)

    def record_step(self, record) -> None:
        """One step (`pool.PassRecord`): the canvases and inputs the step read, and the engine's `StepResult` for
        the rows it ran (its tempered logits, and the sampler's own entropy, accepted mask and temperature)."""
        B, L = record.canvas.shape
        result, device = record.result, record.canvas.device
        ids, logprobs = top_k_logprobs(result.logits, self.k)  # [B', L, k]
        entropy, accepted = result.entropy.float(), result.accepted
        if len(record.sampled) < B:  # fast mode: scatter the rows that ran; the others read as not run
            index = torch.tensor(record.sampled, device=device)
            ids = torch.zeros(B, L, self.k, dtype=ids.dtype, device=device).index_copy(0, index, ids)
            logprobs = torch.zeros(B, L, self.k, device=device).index_copy(0, index, logprobs)
            entropy = torch.full((B, L), float("inf"), device=device).index_copy(0, index, entropy)
            accepted = torch.zeros(B, L, dtype=torch.bool, device=device).index_copy(0, index, accepted)
        frozen = record.frozen.to(device) if record.frozen is not None else torch.zeros(B, dtype=torch.bool,
                                                                                           device=device)
        if result.drawn is not None:  # samplers that draft every position: the draw and its tempered log-prob
            self._add(**drawn_tokens(result, record.sampled, B, device))
        if self.run.trace_sc_embedding:  # the decoder's exact self-conditioning input (zeros: none)
            soft = record.soft if record.soft is not None else record.canvas.new_zeros(B, L, self.hidden)
            self._add(sc_embedding=soft.float()[None])
        self._add(
            canvas_index=torch.tensor([self.canvas], dtype=torch.int32),
            step_index=torch.tensor([self.step], dtype=torch.int32),
            steps_remaining=torch.tensor([record.steps_remaining], dtype=torch.int32),
            temperature=result.temperature[0].reshape(1).float(),
            active=record.active.to(device)[None], input_canvas=record.canvas.to(torch.int32)[None],
            sc_present=self.sc_present[None], sc_ids=self.sc_ids[None], sc_logprobs=self.sc_logprobs[None],
            topk_ids=ids[None], topk_logprobs=logprobs[None],
            argmax=torch.stack([r.argmax for r in record.rows]).to(torch.int32)[None],
            entropy=entropy[None],
            accepted=accepted[None],  # as the sampler decided it
            stopped=torch.tensor([r.stopped for r in record.rows], device=device)[None],
        )
        # the next step's self-conditioning: rows that had not stopped take this step's distribution (spec D.4.4h)
        updated = ~frozen
        self.sc_ids = torch.where(updated[:, None, None], ids, self.sc_ids)
        self.sc_logprobs = torch.where(updated[:, None, None], logprobs, self.sc_logprobs)
        self.sc_present = self.sc_present | updated
        self.step += 1

    def record_row(self, record, j: int) -> None:
        """Mixed batching: row j of the call (`pool.PassRecord`, every row sampled) as a record of its own; within a
        canvas it always takes its step's distribution as the next input (it never waits, stopped, for others)."""
        row, result = record.rows[j], record.result
        n, c = record.row_steps_remaining[j], record.row_canvas_index[j]
        N = row.plan.max_steps
        ids, logprobs = top_k_logprobs(result.logits[j : j + 1], self.k)  # [1, L, k]
        seeded = self.run.self_conditioning_logits
        if n == N:  # a canvas's first step: no input, except a caller's `self_conditioning_logits` on canvas 0
            self.row_sc[row.index] = (top_k_logprobs(seeded[row.index : row.index + 1], self.k)
                                      if c == 0 and seeded is not None else None)
        sc = self.row_sc[row.index]
        if self.run.trace_sc_embedding:  # the decoder's exact self-conditioning input (zeros: none)
            soft = record.soft[j : j + 1] if record.soft is not None else None
            self._add(sc_embedding=(soft.float() if soft is not None
                                    else torch.zeros(1, *ids.shape[1:2], self.hidden))[None])
        self._add(
            row_index=torch.tensor([row.index], dtype=torch.int32),
            canvas_index=torch.tensor([c], dtype=torch.int32),
            step_index=torch.tensor([N - n], dtype=torch.int32),
            steps_remaining=torch.tensor([n], dtype=torch.int32),
            temperature=result.temperature[j].reshape(1).float(),
            active=torch.ones(1, 1, dtype=torch.bool), input_canvas=record.canvas[j : j + 1].to(torch.int32)[None],
            sc_present=torch.tensor([[sc is not None]]),
            sc_ids=(sc[0] if sc is not None else torch.zeros_like(ids))[None],
            sc_logprobs=(sc[1] if sc is not None else torch.zeros_like(logprobs))[None],
            topk_ids=ids[None], topk_logprobs=logprobs[None],
            argmax=result.argmax[j : j + 1].to(torch.int32)[None], entropy=result.entropy[j : j + 1].float()[None],
            accepted=result.accepted[j : j + 1][None], stopped=result.stop[j : j + 1].bool()[None],
        )
        if result.drawn is not None:  # samplers that draft every position: the draw and its tempered log-prob
            drawn = result.drawn[j : j + 1].long()  # [1, L]
            drawn_lp = torch.log_softmax(result.logits[j : j + 1].float(), dim=-1).gather(-1, drawn[..., None])[..., 0]
            self._add(draw_ids=drawn.to(torch.int32)[None], draw_logprobs=drawn_lp[None])
        self.row_sc[row.index] = (ids, logprobs)

    def finish(self, sequences: torch.Tensor) -> Trace:
        """The trace of the whole run; sequences [B, P + C*L] as committed."""
        tensors = {name: torch.cat(parts) for name, parts in self.records.items()}
        if self.mixed and tensors:  # records by row, then canvas and step (each row's own order; a stable sort)
            order = torch.sort(tensors["row_index"], stable=True).indices
            tensors = {name: value[order] for name, value in tensors.items()}
        tensors["sequences"] = sequences.detach().cpu().to(torch.int32)
        P = self.run.input_ids.shape[1]
        mask = self.run.attention_mask
        tensors["attention_mask"] = (mask[:, -P:].bool() if mask is not None
                                     else torch.ones(sequences.shape[0], P, dtype=torch.bool)).cpu()
        return Trace(self.manifest, tensors)
