"""Teacher-forced replay of a trace through our model (docs/reference-accuracy.md).

At every recorded step our decoder gets the trace's own committed prefix, input canvas and self-conditioning state,
so a difference in one step never feeds the next: each step is judged on its own. A minimal trace (prompts and
committed tokens only) scores every committed canvas as a denoising fixed point instead.

Legend: R records, B batch, P prompt, L canvas length, V vocab, H hidden, k top-k width.
"""

import math
from dataclasses import asdict, dataclass, replace

import torch

from ..generation.engine import Plan, StepRows, denoise_rows
from ..generation.entropy_bound import token_entropy
from ..generation.plan import build_plan
from ..generation.sampler import init_sampler_state, sampling_names
from ..generation.stopping import Stopper, stopper_for
from ..generation_config import DiffusionGemmaGenerationConfig, resolve_generation_config
from ..sampler_configs import EntropyBoundSamplerConfig, sampler_config_class
from ..stopper_configs import stopper_config_class
from ..modeling.masks import PaddingSlots
from .format import Trace
from .selfcond import SelfConditioningRebuild, soft_from_top_k  # noqa: F401  (soft_from_top_k: API)


@dataclass
class StepScore:
    """How our model's step agrees with one recorded step, over the rows active at that step.

    top1: fraction of positions where our argmax equals the recorded argmax. kl: mean over positions of
    KL(recorded || ours) on the recorded top-k plus one bucket for the rest of the vocabulary (a lower bound of the
    full KL; exact when k = V). kl_max: its largest position. max_dlogprob: max |recorded - our log-prob| over the
    recorded top-k ids. accepted: fraction of positions where our entropy-bound acceptance agrees. stop: fraction of
    rows whose stopping decision agrees. mean_entropy: our mean entropy (nats). sc_record / sc_ours / sc_spread /
    sc_matched: where this step's self-conditioning input came from (`selfcond.SourceShares`; NaN: none).
    """

    canvas: int
    step: int
    rows: int
    top1: float
    kl: float
    kl_max: float
    max_dlogprob: float
    accepted: float
    stop: float
    mean_entropy: float
    sc_record: float = math.nan
    sc_ours: float = math.nan
    sc_spread: float = math.nan
    sc_matched: float = math.nan
    row: int | None = None  # a mixed trace's row (each row is replayed as its own sequence); None: all rows

    def as_dict(self) -> dict:
        """The fields, with NaN (not measured) as None so the JSON output is strict JSON."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def coarse_kl(rec_logprobs: torch.Tensor, our_logprobs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """KL(recorded || ours) over the k recorded tokens plus one "rest" bucket, per position: [..., k] x2 -> [...].

    The rest bucket is left out when k = V (its mass is only rounding) and is floored at 1e-9 otherwise.
    Example: recorded p = (0.5, 0.5) on k = 2 of V tokens (rest 0), ours q = (0.25, 0.25), rest 0.5 ->
    KL = 2 * 0.5 * ln(0.5 / 0.25) = ln 2 = 0.693.
    """
    rec, our = rec_logprobs.double(), our_logprobs.double()
    kl = (rec.exp() * (rec - our)).sum(dim=-1)
    if rec.shape[-1] < vocab_size:
        p_rest = (1 - rec.exp().sum(dim=-1)).clamp(min=1e-9)
        q_rest = (1 - our.exp().sum(dim=-1)).clamp(min=1e-9)
        kl = kl + p_rest * (p_rest.log() - q_rest.log())
    return kl.clamp(min=0)


def generation_setting(trace: Trace, model, name: str):
    """A generation setting from the trace's manifest, else the model's generation config."""
    settings = trace.manifest.get("generation_config") or {}
    if name == "entropy_bound":
        sampler = settings.get("sampler_config")
        if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
            return sampler["entropy_bound"]
        sampler = model.generation_config.sampler_config
        return sampler.entropy_bound if sampler is not None else 0.1
    if settings.get(name) is not None:
        return settings[name]
    value = getattr(model.generation_config, name, None)
    return value if value is not None else {"stability_threshold": 1, "confidence_threshold": 0.005,
                                            "max_denoising_steps": 48}[name]


class PrefixEncoder:
    """Encodes the trace's committed tokens into a cache the way `generate` does: the prompt, then one canvas per
    round, so positions and padding match."""

    def __init__(self, model, trace: Trace, device):
        self.model, self.trace = model, trace
        seq = trace.tensors["sequences"].to(device=device, dtype=torch.long)  # [B, P + C*L]
        self.sequences = seq
        B, P = seq.shape[0], trace.prompt_length
        mask = trace.tensors.get("attention_mask")
        self.keep = None
        if mask is not None and not bool(mask.all()):
            self.keep = torch.cat([mask.to(device), mask.new_ones(B, seq.shape[1] - P).to(device)], dim=1)
        self.cache = model.new_cache()
        self.cache.reserve(seq.shape[1])
        if self.keep is not None:
            self.cache.padding = PaddingSlots.of(self.keep, self.cache.padding)
        self.encoded = 0  # canvases encoded after the prompt

    def ready_for(self, c: int):
        """Encode up to (not including) canvas c; returns the cache."""
        P, L = self.trace.prompt_length, self.trace.canvas_length
        if self.encoded == 0 and self.cache.length == 0:
            self.model.encode(self.sequences[:, :P], self.cache, keep=self.keep)
        while self.encoded < c:
            start = P + self.encoded * L
            self.model.encode(self.sequences[:, start : start + L], self.cache, keep=self.keep)
            self.encoded += 1
        return self.cache


def step_logprobs(model, canvas, cache, soft, keep, temperature: float) -> torch.Tensor:
    """Our tempered log-probabilities [B, L, V] for one step (decoder + head, then / T)."""
    logits = model.head(model.denoise(canvas, cache, soft, keep=keep))  # [B, L, V] fp32
    return torch.log_softmax(logits.div_(temperature), dim=-1)


RECORDED_SETTINGS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold")


def recorded_config(model, trace: Trace) -> DiffusionGemmaGenerationConfig:
    """The generation config the trace ran with: its manifest's sampler config and step, temperature and stopper
    settings (a field the manifest lacks, as in traces of older versions, comes from the model's config)."""
    settings = trace.manifest.get("generation_config") or {}
    saved = dict(settings.get("sampler_config") or {})
    if saved:
        name = saved.pop("_cls_name", "EntropyBoundSamplerConfig")  # traces before the registry kept only the bound
        try:
            sampler_config = sampler_config_class(name)(**saved)
        except (KeyError, TypeError, ValueError) as error:
            from .format import TraceFormatError

            raise TraceFormatError(f"manifest `generation_config.sampler_config` ({name}) cannot be rebuilt: "
                                   f"{error}") from None
    else:
        sampler_config = model.generation_config.sampler_config or EntropyBoundSamplerConfig(entropy_bound=0.1)
    config, _, _ = resolve_generation_config(model.generation_config, None, {})
    config.sampler_config = sampler_config
    config.stopper_config = recorded_stopper_config(trace)
    for name in RECORDED_SETTINGS:
        if settings.get(name) is not None or getattr(config, name, None) is None:
            setattr(config, name, generation_setting(trace, model, name))
    return config


def replay_plan(model, trace: Trace, device: torch.device | str = "cpu") -> Plan:
    """The trace's plan, built by the one plan builder (`generation.plan.build_plan`) from its recorded settings:
    sampler (manifest `sampling`, `sampler_config`), stopper and temperature schedule."""
    config = recorded_config(model, trace)
    # `sampling` names how the draws were made (ours, or an engine's own name): teacher forcing never needs the
    # draws, so a foreign name is fine (the config class's default runs); ours picks our own registered class
    sampling = trace.manifest.get("sampling")
    if sampling is not None and sampling not in sampling_names(type(config.sampler_config)):
        sampling = None
    try:
        return build_plan(model, config, sampling, device)
    except ValueError as error:
        from .format import TraceFormatError

        raise TraceFormatError(f"manifest `generation_config.sampler_config`: {error}") from None


def replay_stopper(trace: Trace, model) -> Stopper:
    """The trace's stopper: its plug-in `stopper_config` (manifest), else the built-in with the trace's thresholds."""
    return stopper_for(recorded_config(model, trace))


def recorded_stopper_config(trace: Trace):
    """The manifest's plug-in `stopper_config`, rebuilt, or None (the built-in stopper, set by the thresholds)."""
    saved = dict((trace.manifest.get("generation_config") or {}).get("stopper_config") or {})
    if not saved:
        return None
    name = saved.pop("_cls_name", None)
    try:
        return stopper_config_class(name)(**saved)
    except (TypeError, ValueError) as error:
        from .format import TraceFormatError

        raise TraceFormatError(f"manifest `generation_config.stopper_config` ({name}) cannot be rebuilt: "
                               f"{error}") from None


@torch.no_grad()
def replay_full(model, trace: Trace) -> list[StepScore]:
    """Teacher-forced replay of every recorded step through the one engine step (`engine.denoise_rows`, with the
    trace's sampler and stopper) -> one `StepScore` per record (rows active at that step). The sampler's draws come
    from throw-away generators (or a forked global RNG): what is scored (argmax, entropy, acceptance, stopping) is
    what it decides, not its noise."""
    device = next(model.parameters()).device
    t = {k: v.to(device) for k, v in trace.tensors.items()}
    prefix = PrefixEncoder(model, trace, device)
    stack = model.get_decoder()
    plan = replay_plan(model, trace, device)
    B, P = t["sequences"].shape[0], trace.prompt_length
    rebuild = SelfConditioningRebuild(stack, B)
    scores = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for c in range(trace.num_canvases):
            records = trace.steps(c).tolist()
            if not records:
                continue
            cache = prefix.ready_for(c)
            state = plan.stopper.init_state(B, trace.canvas_length, device)
            sampler_state = init_sampler_state(plan.sampler, B, trace.canvas_length, device)
            rebuild.begin_canvas()
            for r in records:
                soft, shares = rebuild.input(t, r)
                canvas = t["input_canvas"][r].long()
                n = int(t["steps_remaining"][r])
                # the temperature this record ran at (the recorded schedule's entry n; kept as recorded)
                step_plan = replace(plan, temperatures=t["temperature"][r].float().expand(plan.max_steps + 1)
                                    .contiguous())
                out = denoise_rows(model, step_plan, StepRows(
                    hidden=model.denoise(canvas, cache, soft, keep=prefix.keep), canvas=canvas,
                    sequences=t["sequences"][:, : P + c * trace.canvas_length], row_ids=list(range(B)),
                    position_offsets=[0] * B, steps_remaining=[n] * B,
                    generators=[torch.Generator(device=device).manual_seed(b) for b in range(B)]
                    if plan.sampler.per_row else None, stop_state=state, sampler_state=sampler_state,
                ), keep_logits=True)
                state, sampler_state = out.stop_state, out.sampler_state
                rebuild.update(t, r, out)
                scores.append(replace(score_step(t, r, c, out), sc_record=shares.record, sc_ours=shares.ours,
                                      sc_spread=shares.spread, sc_matched=shares.matched))
    return scores


def score_step(t: dict, r: int, c: int, out) -> StepScore:
    """Compare our step (`engine.StepResult` with its tempered logits) with record r (the trace's tensors `t`)."""
    active = t["active"][r]  # [B]
    ours = torch.log_softmax(out.logits, dim=-1)  # [B, L, V]
    argmax, entropy = out.argmax, out.entropy
    a = active
    ids = t["topk_ids"][r].long()
    our_top = ours.gather(-1, ids)  # [B, L, k]
    kl = coarse_kl(t["topk_logprobs"][r][a], our_top[a], ours.shape[-1])  # [B_active, L]
    n = int(a.sum())
    if n == 0:
        nan = float("nan")
        return StepScore(c, int(t["step_index"][r]), 0, nan, nan, nan, nan, nan, nan, nan)
    return StepScore(
        canvas=c, step=int(t["step_index"][r]), rows=n,
        top1=float((argmax[a] == t["argmax"][r][a].long()).double().mean()),
        kl=float(kl.mean()), kl_max=float(kl.max()),
        max_dlogprob=float((t["topk_logprobs"][r][a].double() - our_top[a].double()).abs().max()),
        accepted=float((out.accepted[a] == t["accepted"][r][a]).double().mean()),
        stop=float((out.stop[a] == t["stopped"][r][a]).double().mean()),
        mean_entropy=float(entropy[a].double().mean()),
    )


@torch.no_grad()
def replay_minimal(model, trace: Trace) -> list[StepScore]:
    """A minimal trace: each committed canvas fed back as the decoder input (no self-conditioning, T = 1) ->
    one `StepScore` per canvas (step -1) with top1 = argmax agreement with the canvas and our mean entropy; the
    other fields are NaN."""
    device = next(model.parameters()).device
    prefix = PrefixEncoder(model, trace, device)
    scores, nan = [], float("nan")
    for c in range(trace.num_canvases):
        cache = prefix.ready_for(c)
        canvas = trace.committed(c).to(device=device, dtype=torch.long)
        ours = step_logprobs(model, canvas, cache, None, prefix.keep, 1.0)
        top1 = float((ours.argmax(dim=-1) == canvas).double().mean())
        scores.append(StepScore(c, -1, canvas.shape[0], top1, nan, nan, nan, nan, nan,
                                float(token_entropy(ours).double().mean())))
    return scores


def replay(model, trace: Trace) -> list[StepScore]:
    """Per-step scores of a full trace, or per-canvas fixed-point scores of a minimal one."""
    V = model.config.text_config.vocab_size
    vocab = trace.manifest.get("vocab_size")
    if vocab is not None and vocab != V:
        from .format import TraceFormatError

        raise TraceFormatError(f"the trace was recorded with vocab_size {vocab}, the model has {V}")
    if trace.canvas_length != model.canvas_length:
        from .format import TraceFormatError

        raise TraceFormatError(f"the trace has canvas_length {trace.canvas_length}, the model "
                               f"{model.canvas_length}")
    for name in ("sequences", "input_canvas", "argmax", "topk_ids", "sc_ids"):  # a trace without `vocab_size`
        ids = trace.tensors.get(name)
        if ids is not None and ids.numel() and int(ids.max()) >= V:
            from .format import TraceFormatError

            raise TraceFormatError(f"tensor `{name}` holds token id {int(ids.max())}, outside the model's vocabulary "
                                   f"[0, {V})")
    if trace.is_mixed:  # each row as the independent sequence it was in the pool (accuracy/rows.py)
        from .rows import replay_rows

        return replay_rows(model, trace, replay_full)
    return replay_minimal(model, trace) if trace.is_minimal else replay_full(model, trace)
