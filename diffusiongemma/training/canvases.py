"""The block-diffusion loss on responses longer than one canvas, all canvases of an example in one forward.

A response of K canvases x_1 .. x_K after a prompt p is trained as generation produces it: canvas k is denoised
against its clean prefix (p, x_1 .. x_{k-1}). A loop over canvases would run one encoder pass per canvas over a
growing prefix (K passes, O(K^2 L) encoder tokens). BD3-LM's vectorized form does it at once:

    1. one causal encoder pass over the clean sequence (p, x_1 .. x_{K-1}) writes the cache and gives the AR loss;
    2. one denoising pass over the K noisy canvases z_1 .. z_K laid end to end, with a block-diffusion mask
       (`masks.build_canvas_training_masks`): z_k sees the clean slots before its own position and itself.

Every canvas draws its own noise level t_k and self-conditioning coin; the diffusion loss is the mean over every scored
position of every canvas of the batch, as `block_diffusion_loss` pools the positions of a batch. `per_canvas_loss` is
the loop, kept as the reference the vectorized form is tested (and benchmarked) against.

Legend: B batch, P prompt, K canvases, L canvas length, R = K*L response slots, V vocab, H hidden.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..modeling.masks import build_canvas_training_masks
from .loss import (IGNORE_INDEX, SELF_CONDITIONING_RATE, BlockDiffusionLossOutput, autoregressive_loss,
                   check_loss_inputs, corrupt_canvas, sample_noise_level)


@dataclass
class CanvasNoise:
    """One draw of the forward process for a batch of K-canvas responses.

    Attributes:
        noisy: [B, K*L] the corrupted canvases, end to end.
        noise_level: [B, K] t of every canvas.
        self_conditioning_mask: [B, K] bool, canvases whose scored pass is self-conditioned.
    """

    noisy: torch.Tensor
    noise_level: torch.Tensor
    self_conditioning_mask: torch.Tensor


def canvas_count(labels: torch.Tensor, canvas_length: int) -> int:
    """K for labels [B, K*L]; a length that is not a whole number of canvases is a ValueError."""
    R = labels.shape[1]
    if R % canvas_length:
        raise ValueError(f"`labels` longer than one canvas must hold whole canvases: length {R} is not a multiple of "
                         f"the canvas length {canvas_length} (pad the last canvas, e.g. with "
                         "DiffusionGemmaDataCollator)")
    return R // canvas_length


def clean_response(model, labels: torch.Tensor) -> torch.Tensor:
    """labels [B, R] with -100 -> clean ids [B, R], unscored positions filled with pad."""
    return labels.masked_fill(labels == IGNORE_INDEX, model.config.text_config.pad_token_id)


def draw_canvas_noise(
    clean: torch.Tensor, canvas_length: int, vocab_size: int, generator: torch.Generator | None = None,
    self_conditioning_mask: torch.Tensor | None = None,
) -> CanvasNoise:
    """The forward process on every canvas: t [B, K], then the replacement mask and random tokens, then the
    self-conditioning canvases (each with p = 0.5, unless `self_conditioning_mask` [B, K] or [B] is given)."""
    B, R = clean.shape
    K = R // canvas_length
    t = sample_noise_level(B * K, generator, clean.device)  # [B*K]
    noisy = corrupt_canvas(clean.reshape(B * K, canvas_length), t, vocab_size, generator).view(B, R)
    if self_conditioning_mask is None:
        self_conditioning_mask = torch.rand(B, K, generator=generator, device=clean.device) < SELF_CONDITIONING_RATE
    sc = self_conditioning_mask.to(device=clean.device, dtype=torch.bool)
    if sc.dim() == 1:
        sc = sc[:, None].expand(B, K)
    if tuple(sc.shape) != (B, K):
        raise ValueError(f"`self_conditioning_mask` must have shape [{B}] or [{B}, {K}], got {list(sc.shape)}")
    return CanvasNoise(noisy, t.view(B, K), sc)


def _prompt_keep(attention_mask, input_ids):
    return attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)


def _scored_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if bool((labels != IGNORE_INDEX).any()):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    return logits.sum() * 0.0


def multi_canvas_loss(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    self_conditioning_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    ar_weight: float = 1.0,
    noise: CanvasNoise | None = None,
) -> BlockDiffusionLossOutput:
    """Block-diffusion loss of K canvases per example in one encoder and one (or, self-conditioned, two) denoising
    passes.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion`; its canvas length L splits `labels`.
        input_ids: [B, P] the prompt (left padding allowed).
        labels: [B, K*L] the response, whole canvases (the last one padded as generation pads it: EOS, then pad);
            -100 = not scored (batch padding): such positions are pad in the clean prefix and count nowhere.
        attention_mask: [B, P] 1 for real prompt tokens, 0 for left padding.
        self_conditioning_mask: [B, K] (or [B]) bool; default each canvas with p = 0.5.
        generator: source of every random draw (t, replacement mask, random tokens, self-conditioning canvases).
        ar_weight: weight of the next-token loss over the encoded clean sequence (prompt and canvases 1..K-1).
        noise: a `draw_canvas_noise` result to use instead of drawing (tests, `per_canvas_loss` comparisons).
    Returns:
        `BlockDiffusionLossOutput`: `logits` [B, K*L, V] fp32, `noisy_canvas` [B, K*L], `noise_level` [B, K],
        `self_conditioning_mask` [B, K].
    """
    if input_ids is None:
        raise ValueError("multi_canvas_loss needs `input_ids` (the prompt, at least one token)")
    V = model.config.text_config.vocab_size
    L = model.canvas_length
    check_loss_inputs(input_ids, labels, attention_mask, V)
    B, P = input_ids.shape
    K = canvas_count(labels, L)
    clean = clean_response(model, labels)  # [B, R]
    if noise is None:  # 1. the forward process, one noise level per canvas
        noise = draw_canvas_noise(clean, L, V, generator, self_conditioning_mask)

    # 2. one causal encoder pass over the clean prompt and canvases 1..K-1
    prompt_keep = _prompt_keep(attention_mask, input_ids)  # [B, P]
    prefix = torch.cat([input_ids, clean[:, : (K - 1) * L]], dim=1)  # [B, P + (K-1)L]
    keep = None if attention_mask is None else F.pad(prompt_keep, (0, (K - 1) * L), value=True)
    cache = model.new_cache()
    prefix_hidden = model.encode(prefix, cache, keep=keep)  # [B, P + (K-1)L, H]
    ar_loss = None
    if ar_weight:
        ar_keep = torch.cat([prompt_keep, labels[:, : (K - 1) * L] != IGNORE_INDEX], dim=1)
        ar_loss = autoregressive_loss(model.head(prefix_hidden), prefix, ar_keep)

    # 3. the K noisy canvases in one pass each: canvas k sees its clean prefix and itself
    stack = model.get_decoder()
    masks = build_canvas_training_masks(stack.type_shapes, P, L, K, cache.length, keep, B, input_ids.device,
                                        model.attention_backend, stack.decoder_window)
    positions = torch.arange(P, P + K * L, device=input_ids.device)[None]  # [1, R]: canvas k at P + kL ..

    def denoise(soft):
        hidden = stack.denoise(noise.noisy, cache, soft, positions=positions, backend=model.attention_backend,
                               masks=masks)  # [B, R, H]
        return model.head(hidden)  # [B, R, V] fp32

    soft = None
    sc = noise.self_conditioning_mask  # [B, K]
    if bool(sc.any()):  # grad stays on, as in block_diffusion_loss (the cache would copy the prefix otherwise)
        soft = stack.soft_embedding(denoise(None).detach())  # [B, R, H]
        soft = soft * sc.repeat_interleave(L, dim=1).to(soft.dtype)[:, :, None]  # others: MLP(0) = 0 exactly
    logits = denoise(soft)  # [B, R, V]
    diffusion_loss = _scored_loss(logits, labels)
    loss = diffusion_loss if ar_loss is None else diffusion_loss + ar_weight * ar_loss
    return BlockDiffusionLossOutput(
        loss=loss, logits=logits, diffusion_loss=diffusion_loss.detach(),
        ar_loss=ar_loss.detach() if ar_loss is not None else None, noisy_canvas=noise.noisy,
        noise_level=noise.noise_level, self_conditioning_mask=sc,
    )


def per_canvas_loss(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    noise: CanvasNoise,
    attention_mask: torch.Tensor | None = None,
    ar_weight: float = 1.0,
) -> BlockDiffusionLossOutput:
    """The same loss as `multi_canvas_loss` computed canvas by canvas: for each k, encode (prompt, x_1 .. x_{k-1}) into
    a fresh cache and denoise z_k (self-conditioned as `noise` says). K encoder passes; the reference the vectorized
    form is checked against. The AR loss is the last pass's (its prefix holds every earlier one)."""
    L = model.canvas_length
    K = canvas_count(labels, L)
    clean = clean_response(model, labels)
    prompt_keep = _prompt_keep(attention_mask, input_ids)
    stack = model.get_decoder()
    logits, ar_loss = [], None
    for k in range(K):
        prefix = torch.cat([input_ids, clean[:, : k * L]], dim=1)  # [B, P + kL]
        keep = None if attention_mask is None else F.pad(prompt_keep, (0, k * L), value=True)
        cache = model.new_cache()
        hidden = model.encode(prefix, cache, keep=keep)
        if ar_weight and k == K - 1:
            ar_keep = torch.cat([prompt_keep, labels[:, : k * L] != IGNORE_INDEX], dim=1)
            ar_loss = autoregressive_loss(model.head(hidden), prefix, ar_keep)
        noisy = noise.noisy[:, k * L : (k + 1) * L]  # [B, L]
        sc = noise.self_conditioning_mask[:, k]  # [B]
        soft = None
        if bool(sc.any()):
            first = model.head(stack.denoise(noisy, cache, None, keep=keep, backend=model.attention_backend)).detach()
            soft = stack.soft_embedding(first)
            soft = soft * sc.to(soft.dtype)[:, None, None]
        logits.append(model.head(stack.denoise(noisy, cache, soft, keep=keep, backend=model.attention_backend)))
    logits = torch.cat(logits, dim=1)  # [B, R, V]
    diffusion_loss = _scored_loss(logits, labels)
    loss = diffusion_loss if ar_loss is None else diffusion_loss + ar_weight * ar_loss
    return BlockDiffusionLossOutput(
        loss=loss, logits=logits, diffusion_loss=diffusion_loss.detach(),
        ar_loss=ar_loss.detach() if ar_loss is not None else None, noisy_canvas=noise.noisy,
        noise_level=noise.noise_level, self_conditioning_mask=noise.self_conditioning_mask,
    )
