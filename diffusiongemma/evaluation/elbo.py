"""The log-likelihood of a continuation under the block-diffusion objective, by Monte Carlo over noise levels.

A continuation x (n tokens) after a context c is laid out as training lays a response out (`training/canvases.py`):
K = ceil(n / L) canvases of L tokens, the positions after x in the last canvas unscored (-100, filled with pad as
training fills batch padding). One Monte Carlo sample draws, for every canvas k, a noise level t_k ~ U(T_MIN, 1) and
the uniform-state corruption z_k of that canvas (`draw_canvas_noise`), then scores

    f(z) = sum over the n continuation tokens i of  log p_theta(x_i | z_k(i), c, x_1 .. x_{k(i)-1})

in one pass of `multi_canvas_loss` (canvas k sees its clean prefix and its own noisy canvas; no self-conditioning,
no AR term). The estimate is the mean of f over S samples, with its standard error std(f) / sqrt(S).

What it is: the expected per-token log-likelihood the denoiser gives the clean tokens, summed over the continuation;
the negative of the training diffusion loss in sum form. For a continuation of one canvas, one sample equals
-n * `block_diffusion_loss(..., self_conditioning_mask=False).diffusion_loss` drawn from the same generator (the
training loss is this estimate's per-token mean, negated). It is not the exact log p(x | c) (uniform-state
diffusion has no closed-form likelihood); it ranks continuations the way training taught the model to score them.

Randomness: every draw comes from one `torch.Generator` the caller seeds, so the estimate is a function of the seed.

Legend: S samples, P context, n continuation tokens, K canvases, L canvas length, R = K*L, V vocab.
"""

import hashlib
import math
from dataclasses import dataclass

import torch

from ..training.canvases import CanvasNoise, clean_response, draw_canvas_noise, multi_canvas_loss
from ..training.loss import IGNORE_INDEX

DEFAULT_SAMPLES = 32


@dataclass
class ElboEstimate:
    """One continuation's estimate.

    Attributes:
        loglikelihood: mean of f over the samples (nats, summed over the continuation's tokens).
        standard_error: std(f) / sqrt(samples), 0.0 with one sample.
        samples: S.
        tokens: n, the continuation's length.
        is_greedy: the continuation is a fixed point of the denoiser's argmax (see `is_fixed_point`).
    """

    loglikelihood: float
    standard_error: float
    samples: int
    tokens: int
    is_greedy: bool


def request_seed(seed: int, context_ids: list[int]) -> int:
    """A 63-bit seed from `seed` and the context's ids: the choices of one question (same context) share their noise
    draws (common random numbers, so their difference has less variance), and a request's estimate does not depend
    on which other requests ran before it."""
    digest = hashlib.sha256(f"{seed}:{','.join(map(str, context_ids))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def continuation_labels(continuation_ids: list[int], canvas_length: int) -> torch.Tensor:
    """[R] the continuation in whole canvases, -100 after it (R = K*L, K = ceil(n / L))."""
    n = len(continuation_ids)
    K = max(1, math.ceil(n / canvas_length))
    labels = torch.full((K * canvas_length,), IGNORE_INDEX, dtype=torch.long)
    labels[:n] = torch.tensor(continuation_ids, dtype=torch.long)
    return labels


def scored_logprob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits [B, R, V], labels [B, R] (-100 unscored) -> [B] sum of log p(label) over the scored positions."""
    scored = labels != IGNORE_INDEX
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, R, V]
    picked = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # [B, R]
    return (picked * scored).sum(dim=-1)


def noise_scores(model, context: torch.Tensor, labels: torch.Tensor, noise: CanvasNoise) -> torch.Tensor:
    """f for given corruptions: context [P], labels [R], noise.noisy [B, R] -> [B] (one `multi_canvas_loss` pass)."""
    B = noise.noisy.shape[0]
    batch_labels = labels[None].expand(B, -1).to(context.device)
    out = multi_canvas_loss(model, context[None].expand(B, -1), batch_labels, ar_weight=0.0, noise=noise)
    return scored_logprob(out.logits, batch_labels)


def sample_scores(model, context: torch.Tensor, labels: torch.Tensor, samples: int, generator: torch.Generator,
                  batch_size: int) -> torch.Tensor:
    """[S] Monte Carlo samples of f. Every draw is made first, for all S samples at once (so `batch_size`, the samples
    per forward pass, does not change them), then scored `batch_size` samples at a time."""
    L, V = model.canvas_length, model.config.text_config.vocab_size
    K = labels.shape[0] // L
    clean = clean_response(model, labels[None].to(context.device)).expand(samples, -1)  # [S, R]
    no_sc = torch.zeros(samples, K, dtype=torch.bool, device=context.device)
    noise = draw_canvas_noise(clean, L, V, generator, no_sc)  # t [S, K], z [S, R]
    scores = []
    for start in range(0, samples, batch_size):
        part = slice(start, start + batch_size)
        scores.append(noise_scores(model, context, labels, CanvasNoise(
            noise.noisy[part], noise.noise_level[part], noise.self_conditioning_mask[part])))
    return torch.cat(scores)


def fixed_point_logits(model, context: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[R, V] fp32: the denoiser's logits (temperature 1, no self-conditioning) for the clean canvases of `labels` [R]
    (-100 = pad) after the clean `context` [P], each canvas seeing its clean prefix and itself (t = 0). The scoring
    of `compare` (accuracy/engine_compare.py) and of the server's `logprobs` (serving/logprobs.py)."""
    K = labels.shape[0] // model.canvas_length
    clean = clean_response(model, labels[None].to(context.device))  # [1, R]
    noise = CanvasNoise(clean, torch.zeros(1, K, device=context.device),
                        torch.zeros(1, K, dtype=torch.bool, device=context.device))
    return multi_canvas_loss(model, context[None], labels[None].to(context.device), ar_weight=0.0,
                             noise=noise).logits[0]


def is_fixed_point(model, context: torch.Tensor, labels: torch.Tensor) -> bool:
    """Whether the denoiser, given the clean continuation (t = 0) after its clean prefix, predicts every scored token
    back as its argmax: the continuation is a canvas generation's stability check would stop on (the argmax canvas
    no longer changes), so this is the block-diffusion counterpart of 'greedy decoding produces it'."""
    labels = labels.to(context.device)
    scored = labels != IGNORE_INDEX
    return bool((fixed_point_logits(model, context, labels).argmax(dim=-1) == labels)[scored].all())


@torch.no_grad()
def continuation_loglikelihood(model, context_ids: list[int], continuation_ids: list[int],
                               samples: int = DEFAULT_SAMPLES, seed: int = 0, batch_size: int | None = None
                               ) -> ElboEstimate:
    """The Monte Carlo estimate of the module docstring for one (context, continuation) pair.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion`.
        context_ids: the context's ids (at least one token: lm-eval passes the BOS/EOS prefix for an empty context).
        continuation_ids: the ids to score (at least one).
        samples: S, Monte Carlo samples (each one noise level per canvas and one corruption).
        seed: with the context's ids, seeds the generator (`request_seed`).
        batch_size: samples per forward pass (default: all S at once); the draws do not depend on it, so the estimate
            is the same up to float rounding between batch shapes.
    Returns:
        `ElboEstimate`.
    Raises:
        ValueError: an empty context or continuation, or samples < 1, naming the argument.
    """
    if not context_ids:
        raise ValueError("`context_ids` is empty: the continuation needs at least one context token (e.g. BOS)")
    if not continuation_ids:
        raise ValueError("`continuation_ids` is empty: there is nothing to score")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"`samples` must be a positive int, got {samples!r}")
    device = model.device
    context = torch.tensor(context_ids, dtype=torch.long, device=device)  # [P]
    labels = continuation_labels(continuation_ids, model.canvas_length).to(device)  # [R]
    generator = torch.Generator(device=device).manual_seed(request_seed(seed, context_ids))
    f = sample_scores(model, context, labels, samples, generator, batch_size or samples).double()  # [S]
    se = float(f.std(unbiased=True) / math.sqrt(samples)) if samples > 1 else 0.0
    return ElboEstimate(float(f.mean()), se, samples, len(continuation_ids), is_fixed_point(model, context, labels))
