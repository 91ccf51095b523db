"""The block-diffusion training objective: uniform-state discrete diffusion on a canvas, plus an AR prefix loss.

For a clean prefix x_<c (prompt and earlier canvases) and a clean canvas x (L tokens):

    t ~ U(t_min, 1)                                     one per example
    z_i = u_i ~ U(vocab)  with probability t, else x_i  each canvas position independently (uniform-state noise)
    diffusion_loss = mean over non-ignored canvas positions i of  -log p_theta(x_i | z, x_<c)
    ar_loss        = mean over real prefix positions j >= 1 of    -log p_theta(x_j | x_<j)   (encoder outputs)
    loss           = diffusion_loss + ar_weight * ar_loss

Every canvas position is scored with the same weight, corrupted or not: with uniform noise the model cannot tell which
tokens were replaced, so it must predict x_0 everywhere (generation re-noises every position each step, spec D.4g).
Self-conditioning follows the usual recipe: on a random half of the examples a first decoder pass runs without it and
its detached logits condition the second pass, which is the one scored. See docs/training.md.

Legend: B batch, P prefix length, L canvas length, V vocab, H hidden.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.utils import ModelOutput

from ..modeling.validation import check_left_padding, check_token_ids, padding_vector

IGNORE_INDEX = -100
T_MIN = 1e-3
SELF_CONDITIONING_RATE = 0.5


@dataclass
class BlockDiffusionLossOutput(ModelOutput):
    """Result of `block_diffusion_loss`.

    Attributes:
        loss: scalar, `diffusion_loss + ar_weight * ar_loss`.
        logits: [B, L, V] fp32 canvas logits of the scored (second) decoder pass.
        diffusion_loss: scalar cross-entropy over the non-ignored canvas positions.
        ar_loss: scalar next-token cross-entropy of the encoder over the prefix (0 when P < 2).
        noisy_canvas: [B, L] the corrupted canvas the decoder saw.
        noise_level: [B] the sampled t.
        self_conditioning_mask: [B] bool, rows that were self-conditioned.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    diffusion_loss: torch.Tensor | None = None
    ar_loss: torch.Tensor | None = None
    noisy_canvas: torch.Tensor | None = None
    noise_level: torch.Tensor | None = None
    self_conditioning_mask: torch.Tensor | None = None


def sample_noise_level(batch: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """t ~ U(T_MIN, 1), one per example: [B] fp32."""
    return T_MIN + (1 - T_MIN) * torch.rand(batch, generator=generator, device=device)


def corrupt_canvas(
    canvas: torch.Tensor, noise_level: torch.Tensor, vocab_size: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Uniform-state forward process: each token becomes a uniformly random token with probability t of its row.

    Args:
        canvas: [B, L] clean token ids.
        noise_level: [B] t in (0, 1].
    Returns:
        [B, L] noisy ids. A replacement may draw the original token again (the process is uniform over all V).
    """
    B, L = canvas.shape
    replace = torch.rand(B, L, generator=generator, device=canvas.device) < noise_level[:, None]  # [B, L]
    random_tokens = torch.randint(0, vocab_size, (B, L), generator=generator, device=canvas.device)
    return torch.where(replace, random_tokens, canvas)


def autoregressive_loss(logits: torch.Tensor, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Next-token cross-entropy: logits [B, P, V] at position j predict input_ids[:, j+1]; padding ignored."""
    targets = input_ids[:, 1:].clone()  # [B, P-1]
    if keep is not None:
        targets[~(keep[:, 1:] & keep[:, :-1])] = IGNORE_INDEX
    if targets.numel() == 0 or bool((targets == IGNORE_INDEX).all()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def check_loss_inputs(input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None,
                      vocab_size: int) -> None:
    """input_ids [B, P] token ids; labels [B, L] token ids or -100; attention_mask [B, P] left padding with a real
    token in every row. Errors name the argument (an out-of-vocabulary label would be an IndexError deep in
    cross_entropy; an all-padding row would train on nothing)."""
    check_token_ids("input_ids", input_ids, vocab_size)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or labels.dtype not in (torch.long, torch.int32):
        got = f"{labels.dtype} {tuple(labels.shape)}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"`labels` must be a [batch, canvas] tensor of token ids (torch.long), got {got}")
    if labels.shape[0] != input_ids.shape[0] or labels.shape[1] == 0:
        raise ValueError(f"`labels` must have shape [{input_ids.shape[0]}, canvas length], got {list(labels.shape)}")
    scored = labels[labels != IGNORE_INDEX]
    if scored.numel() and (int(scored.min()) < 0 or int(scored.max()) >= vocab_size):
        raise ValueError(f"`labels` hold ids outside the vocabulary [0, {vocab_size}) (other than {IGNORE_INDEX}, "
                         f"which is not scored): min {int(scored.min())}, max {int(scored.max())}")
    if attention_mask is not None:
        keep = padding_vector("attention_mask", attention_mask, input_ids.shape[0], (input_ids.shape[1],))
        check_left_padding("attention_mask", keep)


def block_diffusion_loss(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    self_conditioning_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    ar_weight: float = 1.0,
) -> BlockDiffusionLossOutput:
    """Block-diffusion loss of a `DiffusionGemmaForBlockDiffusion` on one (prefix, canvas) pair per example.

    Labels longer than the model's canvas length are a response of several whole canvases: they go to
    `canvases.multi_canvas_loss` (every canvas trained against its clean prefix, all in one forward).

    Args:
        model: the model; `encode`, `denoise`, `head` and `get_decoder().soft_embedding` are used.
        input_ids: [B, P] clean prefix (prompt and earlier canvases), encoded once into a fresh cache.
        labels: [B, L] clean canvas; positions equal to -100 are not scored (they are filled with pad before noising).
            [B, K*L] with L = `model.canvas_length` and K > 1: K canvases (see `multi_canvas_loss`).
        attention_mask: [B, P] 1 for real prefix tokens, 0 for (left) padding.
        self_conditioning_mask: [B] bool rows that get a self-conditioning pass; default: each row with p = 0.5.
        generator: source of every random draw (t, replacement mask, random tokens, self-conditioning rows).
        ar_weight: weight of the autoregressive loss on the encoder outputs (1.0 as in NeMo Automodel's recipe).
    Returns:
        `BlockDiffusionLossOutput` with `loss`, `logits` [B, L, V] and the two components.
    """
    if input_ids is None:
        raise ValueError("block_diffusion_loss needs `input_ids` (the clean prefix, at least one token)")
    if isinstance(ar_weight, bool) or not isinstance(ar_weight, (int, float)) or not math.isfinite(ar_weight) \
            or ar_weight < 0:
        raise ValueError(f"the AR loss weight (config.ar_loss_weight, `train sft --ar-weight`) must be a finite "
                         f"number >= 0, got {ar_weight!r}")
    if isinstance(labels, torch.Tensor) and labels.dim() == 2 and labels.shape[1] > model.canvas_length:
        from .canvases import multi_canvas_loss

        return multi_canvas_loss(model, input_ids, labels, attention_mask, self_conditioning_mask, generator,
                                 ar_weight)
    V = model.config.text_config.vocab_size
    check_loss_inputs(input_ids, labels, attention_mask, V)
    B, L = labels.shape
    device = labels.device
    scored = labels != IGNORE_INDEX  # [B, L]
    clean = labels.masked_fill(~scored, model.config.text_config.pad_token_id)

    # 1. noise: the draw order (t, replace mask, random tokens, self-conditioning rows) is part of the contract
    t = sample_noise_level(B, generator, device)  # [B]
    noisy = corrupt_canvas(clean, t, V, generator)  # [B, L]
    if self_conditioning_mask is None:
        self_conditioning_mask = torch.rand(B, generator=generator, device=device) < SELF_CONDITIONING_RATE
    self_conditioning_mask = self_conditioning_mask.to(device=device, dtype=torch.bool)

    # 2. encoder on the clean prefix: one cache write, and the AR logits
    keep = attention_mask.bool() if attention_mask is not None else None
    cache = model.new_cache()
    prefix_hidden = model.encode(input_ids, cache, keep=keep)  # [B, P, H]
    ar_loss = autoregressive_loss(model.head(prefix_hidden), input_ids, keep) if ar_weight else None

    # 3. self-conditioning: a first pass without it; its detached logits condition the scored pass
    soft = None
    if bool(self_conditioning_mask.any()):
        # Grad stays enabled: a no-grad pass would make the cache copy the prefix into a non-differentiable buffer.
        first = model.head(model.denoise(noisy, cache, keep=keep)).detach()  # [B, L, V]
        soft = model.get_decoder().soft_embedding(first)  # [B, L, H]
        soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]  # rows without it: MLP(0) = 0 exactly

    # 4. the scored pass
    logits = model.head(model.denoise(noisy, cache, soft, keep=keep))  # [B, L, V] fp32
    if bool(scored.any()):
        diffusion_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    else:
        diffusion_loss = logits.sum() * 0.0
    loss = diffusion_loss if ar_loss is None else diffusion_loss + ar_weight * ar_loss
    return BlockDiffusionLossOutput(
        loss=loss,
        logits=logits,
        diffusion_loss=diffusion_loss.detach(),
        ar_loss=ar_loss.detach() if ar_loss is not None else None,
        noisy_canvas=noisy,
        noise_level=t,
        self_conditioning_mask=self_conditioning_mask,
    )
