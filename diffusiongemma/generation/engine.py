"""The one denoising step (spec D.4.4b-i) after the decoder: LM head, the user's processors, the temperature, the
sampler, the self-conditioning input, the stopper and the fault codes, for any set of rows.

Every caller runs it: lock-step `generate` (reference and fast), the row pool behind mixed `generate` and
`diffusiongemma serve`, trace recording (which reads what it returns) and `compare` replay. The callers differ only
in how they run the decoder: lock-step over one shared `BlockDiffusionCache`, the row pool in one forward that mixes
prefill, commit and denoising rows over a `RowCache` (so the decoder call cannot live here: it serves rows in every
phase). They hand this step the canvas hidden states of the rows that sample.

A `Plan` says how rows denoise (sampler, stopper, temperature schedule, processors), resolved once per `generate`
call or per distinct request settings in the server. Rows sharing a plan run in one call.

The step reads no device value on the host, so on a GPU it queues its kernels without waiting.

Legend: B' rows that sample, L canvas length, V vocab, H hidden, S' committed tokens.
"""

import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch
from transformers import LogitsProcessorList

from ..modeling.host import device_tensor
from .entropy_bound import SoftEmbed
from .finite import fault_codes, model_logits_bad, processed_scores_bad, raise_for_faults
from .sampler import Sampler
from .stopping import Stopper


@dataclass(frozen=True)
class Plan:
    """How a set of rows denoises; built once, shared by every step.

    Attributes:
        sampler / stopper: the plug-ins (`sampler.Sampler`, `stopping.Stopper`).
        max_steps: N, the denoising steps per canvas.
        temperatures: [N + 1] fp32 on the device, entry n the temperature with n steps remaining (spec D.4c).
        processors: the user's logits processors (3-D scores), or None.
        soft_embed: hands the sampler the embedding of its probabilities for self-conditioning, or None: reference
            mode with non-fp32 embeddings, where the input must come from the logits (`soft_embedder`).
        constraint: a `constraints.ConstraintGuide` (the argmax canvas becomes the best one the constraint
            accepts), or None.
    """

    sampler: Sampler
    stopper: Stopper
    max_steps: int
    temperatures: torch.Tensor
    processors: LogitsProcessorList | None
    soft_embed: SoftEmbed | None
    constraint: object | None = None

    @cached_property
    def processor_arguments(self) -> tuple:
        """Per processor, the extra arguments its `__call__` names (None: it takes **kwargs), read once per plan."""
        return tuple(named_arguments(p) for p in self.processors or ())


@dataclass
class StepRows:
    """The B' rows one step samples, all under one `Plan`.

    Attributes:
        hidden: [B', L, H] the decoder's canvas hidden states (None when `logits` is given).
        canvas: [B', L] the canvas the decoder read.
        sequences: the committed tokens processors see: one [B', S'] tensor (lock-step: every row as long), or one
            [S'_b] tensor per row (the row pool; processors then run row by row).
        row_ids: each row's identity (its index in the request batch, or its request in the server).
        position_offsets: each row's position of canvas slot 0 (its committed tokens without padding).
        steps_remaining: each row's n (N..1): its temperature and the processors' `cur_step`.
        generators: one `torch.Generator` per row for per-row samplers, else None.
        stop_state: the stopper's state of these rows (batch first), or None.
        logits: [B', L, V] fp32 the LM head's output, when the caller's pass ran it (the compiled pass), else None.
        sampler_state: a stateful sampler's state of these rows (`Sampler.init_state`, batch first), or None.
    """

    hidden: torch.Tensor | None
    canvas: torch.Tensor
    sequences: torch.Tensor | list[torch.Tensor]
    row_ids: list[int]
    position_offsets: list[int]
    steps_remaining: list[int]
    generators: Sequence[torch.Generator] | None
    stop_state: torch.Tensor | None
    logits: torch.Tensor | None = None
    sampler_state: torch.Tensor | None = None


@dataclass
class StepResult:
    """What one step produced for its B' rows (traces read it as it is; nothing recomputes it)."""

    canvas: torch.Tensor  # [B', L] next decoder input
    argmax: torch.Tensor  # [B', L]
    accepted: torch.Tensor  # [B', L] bool
    entropy: torch.Tensor  # [B', L] fp32
    soft: torch.Tensor  # [B', L, H] next self-conditioning input
    stop: torch.Tensor  # [B'] bool, the stopper's decision
    stop_state: torch.Tensor | None
    faults: torch.Tensor  # [B'] int8 (finite.py)
    temperature: torch.Tensor  # [B'] fp32
    logits: torch.Tensor | None = None  # [B', L, V] tempered, when asked for (traces, logits streamers)
    sampler_state: torch.Tensor | None = None  # [B', ...] a stateful sampler's state for the next step
    drawn: torch.Tensor | None = None  # [B', L] the sampler's draw at every position, when it reports one (traces)


def soft_embedder(stack, exact_reference: bool) -> SoftEmbed | None:
    """The self-conditioning input built from a step's softmax probabilities, or None when it must come from the
    logits instead.

    Reference mode reuses the sampler's fp32 probabilities only with fp32 embeddings, where the built-in's
    softmax(logits.to(embedding dtype)) is the very same tensor; fast mode always does (like vLLM, spec E).
    """
    if exact_reference and stack.embed_tokens.weight.dtype != torch.float32:
        return None
    return stack.embed_tokens.soft


def row_temperatures(plan: Plan, steps_remaining: list[int]) -> torch.Tensor:
    """[B'] fp32 on the device: each row's temperature, indexed from the plan's schedule (no host-to-device copy)."""
    if all(n == steps_remaining[0] for n in steps_remaining):
        return plan.temperatures[steps_remaining[0]].expand(len(steps_remaining))
    return plan.temperatures[device_tensor(steps_remaining, torch.long, plan.temperatures.device)]  # async copy


def apply_processors(plan: Plan, rows: StepRows, logits: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
    """The user's processors on logits [B', L, V] -> (scores, (processors_bad [B'], empty [B'])).

    Plain transformers processors get `(input_ids, scores)`; a processor whose `__call__` names more parameters gets
    them by name from: `cur_step` (0-d int32, steps remaining, as the built-in passes it), `canvas` [B', L],
    `row_ids` and `position_offsets` (host lists). With one tensor of committed tokens the list runs once over all
    rows (as the built-in does); with one sequence per row it runs row by row, each with its own [1, ...] slices.
    """
    shape = logits.shape
    if isinstance(rows.sequences, torch.Tensor):
        logits = call_processors(plan, rows.sequences, logits, processor_kwargs(rows, slice(None)))
    else:
        for j, seen in enumerate(rows.sequences):
            scores = call_processors(plan, seen[None], logits[j : j + 1],
                                     processor_kwargs(rows, slice(j, j + 1)))
            processed_scores_bad(scores, logits[j : j + 1].shape)  # None or a wrong shape: a clear error
            logits[j : j + 1] = scores
    return logits, processed_scores_bad(logits, shape)


def named_arguments(processor) -> tuple[tuple[str, bool], ...] | None:
    """(name, required) of each parameter `processor.__call__` takes after (input_ids, scores); None for **kwargs."""
    params = inspect.signature(processor).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return tuple((n, params[n].default is inspect.Parameter.empty) for n in list(params)[2:])


def call_processors(plan: Plan, input_ids: torch.Tensor, scores: torch.Tensor, available: dict) -> torch.Tensor:
    """`processors(input_ids, scores)` where each processor gets, by name, the extra arguments its `__call__` names
    among `available` (all of them if it takes `**kwargs`). transformers' own list would hand every processor every
    keyword, which breaks the ones that take only `cur_step`."""
    for processor, names in zip(plan.processors, plan.processor_arguments):
        if names is None:
            extra = available
        else:
            missing = [n for n, required in names if n not in available and required]
            if missing:
                raise ValueError(f"logits processor {type(processor).__name__} asks for {missing}; a denoising step "
                                 f"passes {sorted(available)}")
            extra = {n: available[n] for n, _ in names if n in available}
        scores = processor(input_ids, scores, **extra)
    return scores


def processor_kwargs(rows: StepRows, part: slice) -> dict:
    return {"cur_step": torch.tensor(rows.steps_remaining[part][0], dtype=torch.int32), "canvas": rows.canvas[part],
            "row_ids": rows.row_ids[part], "position_offsets": rows.position_offsets[part]}


def denoise_rows(model, plan: Plan, rows: StepRows, keep_logits: bool = False) -> StepResult:
    """One denoising step for `rows` (spec D.4.4b-i) -> `StepResult`.

    Order, as the reference: LM head, processors, temperature, sampler (draws), self-conditioning, stopper.
    """
    stack = model.get_decoder()
    # b. LM head for the rows that sample
    logits = rows.logits if rows.logits is not None else model.head(rows.hidden)  # [B', L, V] fp32
    model_bad = model_logits_bad(logits)  # [B'] on the device: read with the stop flags (finite.py)
    # c. user processors first, then the temperature, in place
    processors_bad, empty = None, None
    if plan.processors:
        logits, (processors_bad, empty) = apply_processors(plan, rows, logits)
    temperature = row_temperatures(plan, rows.steps_remaining)  # [B']
    logits = logits.div_(temperature[:, None, None])
    path = None
    if plan.constraint is not None:  # the constraint's best canvas (and, if it projects, its allowed tokens)
        logits, path = plan.constraint.project(logits, rows.sequences, rows.row_ids, rows.position_offsets)
    # d-g. the sampler: argmax, entropy, sample, accept, re-noise, and (from its softmax) the self-conditioning input
    soft = None
    if plan.soft_embed is None:  # from the logits, before the sampler may overwrite them (no RNG involved)
        soft = stack.soft_embedding(logits, round_to=stack.embed_tokens.weight.dtype)  # [B', L, H]
    kept = logits.clone() if keep_logits else None
    step = [plan.max_steps - n for n in rows.steps_remaining]
    try:
        if rows.sampler_state is None:
            out = plan.sampler.step(logits, rows.canvas, temperature, step, rows.generators, plan.soft_embed)
        else:  # a stateful sampler (one with `init_state`) gets its state back
            out = plan.sampler.step(logits, rows.canvas, temperature, step, rows.generators, plan.soft_embed,
                                    state=rows.sampler_state)
    except RuntimeError:  # the reference multinomial refuses NaN: name the cause (an error path may read the host)
        empty = empty if empty is not None else torch.zeros_like(model_bad)
        raise_for_faults(fault_codes(model_bad, processors_bad, empty).tolist(), step[0] + 1, None, rows.row_ids)
        raise
    if path is not None:  # what the stopper reads and the commit keeps: a canvas the constraint accepts
        out = out._replace(argmax=path)
    if soft is None:
        soft = out.soft
    if soft is None:  # the sampler left the logits untouched and built no soft embedding: do it here (spec C.9)
        soft = plan.soft_embed(torch.softmax(logits, dim=-1))
    del logits
    nan = out.entropy.isnan().any(dim=-1)
    empty = nan if empty is None else empty | nan  # [B']
    # i. the stopper's decision and the fault codes stay on the device
    stop, stop_state = plan.stopper(out.argmax, out.entropy, rows.stop_state)
    return StepResult(canvas=out.canvas, argmax=out.argmax, accepted=out.accepted, entropy=out.entropy, soft=soft,
                      stop=stop, stop_state=stop_state, faults=fault_codes(model_bad, processors_bad, empty),
                      temperature=temperature, logits=kept, sampler_state=out.state,
                      drawn=out.drawn)
