"""Discrete DDIM (diffusers' `DiscreteDDIMScheduler`): ancestral sampling from the exact posterior q(x_s | x_t, x0)
of the uniform corruption process, with optional leave-one-out Gibbs corrector sweeps.

Time grid: with P predictor steps, predictor step i goes from alpha_t = i / P to alpha_s = (i + 1) / P (alpha is a
clean token's survival probability). Each position draws x0 from the model, then one of three routes:

    clean  (take x0):        alpha_s (1 - a) / V + a alpha_s [x_t = x0]      with a = alpha_t / alpha_s
    stay   (keep x_t):       a (1 - alpha_s) / V
    noise  (uniform token):  (1 - a)(1 - alpha_s) / V

normalized; the last step (alpha_s = 1) takes x0 everywhere.

Corrector (`corrector_steps` = c > 0): the step budget N counts model passes, as diffusers' pipeline counts them.
The first K = (N - 1) // (1 + c) predictor steps are each followed by c corrector passes, so P = N - K c. A corrector
pass, at alpha = alpha_s of its predictor step, turns the logits into the leave-one-out denoiser (the current token's
logit lowered by log(1 + V alpha / (1 - alpha))), forms Cat(alpha x0_loo + (1 - alpha) / V) in float64, picks
`corrector_k` positions per row by Gumbel-top-k on `corrector_selection`, and resamples them.
Example: N = 8, c = 2 -> K = 2, P = 4: passes are P0 C0 C0 P1 C1 C1 P2 P3.

Legend: B rows, L canvas length, V vocab, k corrector picks per row.
"""

import math
from dataclasses import asdict, dataclass

import torch

from ..generation_config import MAX_DENOISING_STEPS
from ..modeling.host import device_tensor
from .commit import draft
from .draws import Generators, categorical, random_tokens, uniforms
from .entropy_bound import SoftEmbed, StepOutput

SELECTIONS = ("lowest_log_margin", "lowest_maxprob", "lowest_current_prob", "random")


@dataclass
class DiscreteDDIMSamplerConfig:
    """Settings of the discrete DDIM sampler (diffusers' `DiscreteDDIMScheduler`).

    Args:
        corrector_steps: corrector passes after each of the first predictor steps (0: plain ancestral DDIM).
        corrector_k: positions resampled per row in a corrector pass (>= 1, at most the canvas).
        corrector_selection: which positions: "lowest_log_margin", "lowest_maxprob", "lowest_current_prob" or
            "random".
        corrector_selection_tau: temperature of the Gumbel-top-k selection (> 0; lower is greedier).
        greedy: x0 is the argmax token (diffusers' `temperature=0`) instead of a sample.
    """

    corrector_steps: int = 0
    corrector_k: int = 1
    corrector_selection: str = "lowest_log_margin"
    corrector_selection_tau: float = 1.0
    greedy: bool = False

    def __post_init__(self):
        owner = type(self).__name__
        for name, low in (("corrector_steps", 0), ("corrector_k", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"`{owner}.{name}` must be an integer >= {low}, got {value!r}")
        if self.corrector_steps > MAX_DENOISING_STEPS - 2:  # no step budget leaves room for more (check_step_budget)
            raise ValueError(f"`{owner}.corrector_steps` must be at most {MAX_DENOISING_STEPS - 2} (the largest "
                             f"max_denoising_steps, {MAX_DENOISING_STEPS}, minus 2), got {self.corrector_steps!r}")
        if self.corrector_selection not in SELECTIONS:
            raise ValueError(f"`{owner}.corrector_selection` must be one of {list(SELECTIONS)}, got "
                             f"{self.corrector_selection!r}")
        tau = self.corrector_selection_tau
        if isinstance(tau, bool) or not isinstance(tau, float) or not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"`{owner}.corrector_selection_tau` must be a finite float > 0, got {tau!r}")
        if not isinstance(self.greedy, bool):
            raise ValueError(f"`{owner}.greedy` must be true or false, got {self.greedy!r}")

    def check_step_budget(self, max_steps: int) -> None:
        """Corrector passes must fit the step budget N: the first corrected predictor step needs 1 + c passes and at
        least one more predictor step follows, so c <= N - 2 (with c > N - 2 no step would be corrected).

        Raises:
            ValueError: naming `corrector_steps` and `max_denoising_steps`.
        """
        if self.corrector_steps > 0 and self.corrector_steps > max_steps - 2:
            raise ValueError(f"`{type(self).__name__}.corrector_steps` must be at most max_denoising_steps - 2 = "
                             f"{max_steps - 2} (each corrected predictor step takes 1 + corrector_steps of the "
                             f"{max_steps} passes, and one predictor step must follow), got {self.corrector_steps}")

    def to_dict(self) -> dict:
        return {**asdict(self), "_cls_name": type(self).__name__}


def pass_schedule(max_steps: int, corrector_steps: int) -> list[tuple[int, bool]]:
    """What each of the N passes of a canvas does: (predictor step i, is a corrector pass), and P = the number of
    predictor steps is the largest i + 1. Example: N = 5, c = 1 -> K = 2: P0 C0 P1 C1 P2."""
    c = corrector_steps
    corrected = (max_steps - 1) // (1 + c) if c > 0 else 0
    passes = [(i, j > 0) for i in range(corrected) for j in range(1 + c)]
    predictors = max_steps - corrected * c
    return passes + [(i, False) for i in range(corrected, predictors)]


def route_probabilities(canvas: torch.Tensor, x0: torch.Tensor, i: int, predictors: int, vocab_size: int
                        ) -> torch.Tensor:
    """[B, L, 3] fp32: the posterior mass of (clean, stay, noise) for predictor step i of P, normalized."""
    alpha_t, alpha_s = i / predictors, (i + 1) / predictors
    a = alpha_t / alpha_s
    same = (canvas == x0).float()  # [B, L]
    clean = alpha_s * (1 - a) / vocab_size + a * alpha_s * same
    stay = a * (1 - alpha_s) / vocab_size * torch.ones_like(same)
    noise = (1 - a) * (1 - alpha_s) / vocab_size * torch.ones_like(same)
    routes = torch.stack([clean, stay, noise], dim=-1)
    return routes / routes.sum(dim=-1, keepdim=True)


def conditional_log_probs(logits: torch.Tensor, canvas: torch.Tensor, alpha: float) -> torch.Tensor:
    """log Cat(alpha x0_loo + (1 - alpha) / V) per position, [B, L, V] float64, from logits [B, L, V] and the
    current canvas [B, L]; x0_loo is the leave-one-out denoiser for the uniform kernel (0 < alpha < 1)."""
    V = logits.shape[-1]
    loo = logits.double()
    if 0.0 < alpha < 1.0:
        shift = math.log1p(V * alpha / (1.0 - alpha))
        loo = loo.clone()
        loo.scatter_add_(-1, canvas[..., None], torch.full((*canvas.shape, 1), -shift, dtype=loo.dtype,
                                                           device=loo.device))
    log_p = torch.log_softmax(loo, dim=-1)
    floor = math.log1p(-alpha) - math.log(V)
    return torch.logaddexp(math.log(alpha) + log_p, torch.full_like(log_p, floor))


def doubt(cond: torch.Tensor, canvas: torch.Tensor, selection: str) -> torch.Tensor:
    """[B, L] float64: how much each position should be resampled (higher: more) under `selection`."""
    current = cond.gather(-1, canvas[..., None])[..., 0]  # [B, L]
    if selection == "lowest_maxprob":
        return -cond.max(dim=-1).values
    if selection == "lowest_current_prob":
        return -current
    others = cond.clone().scatter_(-1, canvas[..., None], float("-inf"))
    return -(current - others.max(dim=-1).values)  # lowest_log_margin


def corrector_positions(cond: torch.Tensor, canvas: torch.Tensor, k: int, selection: str, tau: float,
                        generators: Generators) -> torch.Tensor:
    """[B, k] positions to resample per row: Gumbel-top-k of doubt / tau (RNG: B*L uniforms), or k at random."""
    B, L = canvas.shape
    k = min(k, L)
    if selection == "random":
        return torch.topk(uniforms((B, L), canvas.device, generators), k=k, dim=-1).indices
    keys = doubt(cond, canvas, selection) / tau
    u = uniforms(tuple(keys.shape), keys.device, generators).clamp_(1e-12, 1.0 - 1e-12)  # fp32, as diffusers
    return torch.topk(keys + (-torch.log(-torch.log(u))), k=k, dim=-1).indices


class DiscreteDDIMSampler:
    """Discrete DDIM drawing from one generator per row (row b equals diffusers' scheduler run on row b alone with
    generators[b]). Predictor pass per row: L draws of x0 (unless greedy), L route draws, L noise tokens; corrector
    pass: L uniforms (selection), k draws.

    `accepted`: predictor: positions that took x0; corrector: positions not resampled.
    """

    per_row = True

    def __init__(self, config: DiscreteDDIMSamplerConfig, context):
        self.config = config
        self.vocab_size = context.vocab_size
        self.schedule = pass_schedule(context.max_steps, config.corrector_steps)
        self.predictors = self.schedule[-1][0] + 1

    def init_canvas(self, batch: int, length: int, device: torch.device, generators) -> torch.Tensor:
        return random_tokens(self.vocab_size, (batch, length), device, generators)  # RNG: canvas init

    def step(self, logits: torch.Tensor, canvas: torch.Tensor, temperature, step, generators,
             soft_embed: SoftEmbed | None = None) -> StepOutput:
        entries = [self.schedule[s] for s in step]
        if all(e == entries[0] for e in entries):
            return self._pass(logits, canvas, entries[0], generators, soft_embed)
        # rows at different places of the schedule (the row pool): each kind of pass on its own rows
        parts = {}
        for b, e in enumerate(entries):
            parts.setdefault(e, []).append(b)
        outs = []
        for e, rows in parts.items():
            index = device_tensor(rows, torch.long, logits.device)  # async copy, no host sync
            gens = [generators[b] for b in rows] if generators is not None else None
            outs.append((index, self._pass(logits[index], canvas[index], e, gens, soft_embed)))
        return StepOutput(*(merge([(index, out[f]) for index, out in outs], canvas.shape[0])
                            for f in range(len(StepOutput._fields))))

    def _pass(self, logits, canvas, entry, generators, soft_embed) -> StepOutput:
        i, correcting = entry
        d = draft(logits, self.config.greedy or correcting, generators, soft_embed)  # RNG: x0 (predictor, unless greedy)
        if correcting:
            return self._correct(logits, canvas, i, generators, d)
        routes = categorical(route_probabilities(canvas, d.tokens, i, self.predictors, self.vocab_size), generators)
        noise = random_tokens(self.vocab_size, tuple(canvas.shape), canvas.device, generators)
        nxt = torch.where(routes == 0, d.tokens, canvas)
        nxt = torch.where(routes == 2, noise, nxt)
        return StepOutput(nxt, d.argmax, routes == 0, d.entropy, d.soft, drawn=d.tokens)

    def _correct(self, logits, canvas, i, generators, d) -> StepOutput:
        cfg = self.config
        alpha = (i + 1) / self.predictors
        cond = conditional_log_probs(logits, canvas, alpha)  # [B, L, V] float64
        positions = corrector_positions(cond, canvas, cfg.corrector_k, cfg.corrector_selection,
                                        cfg.corrector_selection_tau, generators)  # [B, k]
        rows = torch.arange(canvas.shape[0], device=canvas.device)[:, None].expand_as(positions)
        picked = cond[rows, positions].exp()  # [B, k, V]
        resampled = categorical(picked, generators)  # [B, k]
        nxt = canvas.clone()
        nxt[rows, positions] = resampled
        held = torch.ones_like(canvas, dtype=torch.bool)
        held[rows, positions] = False
        return StepOutput(nxt, d.argmax, held, d.entropy, d.soft, drawn=d.tokens)


def merge(parts: list[tuple[torch.Tensor, torch.Tensor | None]], batch: int) -> torch.Tensor | None:
    """Scatter (row index [b], rows [b, ...]) pieces back into one [B, ...] tensor (None stays None)."""
    if parts[0][1] is None:
        return None
    first = parts[0][1]
    out = first.new_empty(batch, *first.shape[1:])
    for index, rows in parts:
        out[index] = rows
    return out


class DiscreteDDIMReferenceSampler(DiscreteDDIMSampler):
    """Discrete DDIM drawing from the global RNG over the whole batch, in diffusers' order."""

    per_row = False
