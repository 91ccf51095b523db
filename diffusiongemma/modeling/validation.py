"""Argument checks for `forward`: every bad input gets an error naming the argument and what was expected."""

from dataclasses import dataclass

import torch


@dataclass
class CheckedInputs:
    """Derived facts of a validated forward call.

    Attributes:
        batch: B.
        encoder_keep: [B, S+P] bool padding vector for the encoder pass, or None.
        decoder_keep: [B, S'] bool padding vector over the cached slots for the decoder pass, or None.
    """

    batch: int
    encoder_keep: torch.Tensor | None
    decoder_keep: torch.Tensor | None


def check_token_ids(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    """ids must be a 2-D integer tensor with values in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape [batch, length], got {tuple(ids.shape)}")
    if ids.dtype not in (torch.long, torch.int32):
        raise ValueError(f"`{name}` must hold integer token ids of dtype torch.long (or torch.int32), got dtype "
                         f"{ids.dtype}: convert with `.long()`")
    if ids.shape[0] == 0:
        raise ValueError(f"`{name}` must contain at least one row, got shape {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError(f"`{name}` must contain at least one token, got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"`{name}` holds token ids outside the vocabulary [0, {vocab_size}): min {int(ids.min())}, "
            f"max {int(ids.max())}"
        )


def padding_vector(name: str, mask: torch.Tensor, batch: int, lengths: tuple[int, ...]) -> torch.Tensor:
    """A 2-D 0/1 mask of shape [B, n] with n in `lengths` -> bool; errors name the argument."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"`{name}` must be a 2-D tensor [batch, length], got {got}")
    if mask.shape[0] != batch or mask.shape[1] not in lengths:
        expected = " or ".join(f"[{batch}, {n}]" for n in lengths)
        raise ValueError(f"`{name}` must have shape {expected}, got {list(mask.shape)}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"`{name}` must contain only 0 and 1")
    return mask.bool()


def check_left_padding(name: str, keep: torch.Tensor) -> None:
    """keep [B, n] bool must be left padding: each row some 0s, then only 1s, at least one 1 (a row that is all
    padding, padding on the right or a hole in the middle would be attended differently from the prompt alone).

    Reads the mask on the host once (called when a call's arguments are resolved, never inside a step)."""
    rows = keep.shape[0]
    empty = ~keep.any(dim=1)  # [B]
    holes = (keep[:, :-1] & ~keep[:, 1:]).any(dim=1)  # [B]: a 1 followed by a 0
    empty, holes = torch.stack([empty, holes]).cpu().tolist()
    if any(empty):
        raise ValueError(f"`{name}` marks every token of batch rows {[b for b in range(rows) if empty[b]]} as "
                         "padding: each row needs at least one real token")
    if any(holes):
        raise ValueError(f"`{name}` of batch rows {[b for b in range(rows) if holes[b]]} is not left padding (a 0 "
                         "after a 1: right padding or a hole); pad on the left (tokenizer padding_side='left')")


def check_forward_inputs(
    vocab_size: int,
    max_positions: int,
    canvas_length: int,
    input_ids,
    attention_mask,
    past_key_values,
    decoder_input_ids,
    self_conditioning_logits,
    self_conditioning_mask,
    decoder_attention_mask,
) -> CheckedInputs:
    from .cache import BlockDiffusionCache

    if input_ids is None and past_key_values is None:
        raise ValueError("Either `input_ids` or `past_key_values` must be provided: the canvas attends to a prefix")
    if past_key_values is not None and not isinstance(past_key_values, BlockDiffusionCache):
        raise TypeError(
            "`past_key_values` must be a diffusiongemma BlockDiffusionCache (from `model.new_cache()` or an earlier "
            f"output), got {type(past_key_values).__name__}"
        )
    cached = past_key_values.length if past_key_values is not None else 0
    batch = None
    if input_ids is not None:
        check_token_ids("input_ids", input_ids, vocab_size)
        batch = input_ids.shape[0]
    if decoder_input_ids is not None:
        check_token_ids("decoder_input_ids", decoder_input_ids, vocab_size)
        if batch is not None and decoder_input_ids.shape[0] != batch:
            raise ValueError(
                f"`decoder_input_ids` has batch {decoder_input_ids.shape[0]} but `input_ids` has batch {batch}"
            )
        batch = decoder_input_ids.shape[0]
    if batch is None:
        first = next((k for k in past_key_values.keys if k is not None), None)
        batch = first.shape[0] if first is not None else 1
    if past_key_values is not None and cached:
        cache_batch = next(k for k in past_key_values.keys if k is not None).shape[0]
        if cache_batch != batch:
            raise ValueError(f"`past_key_values` holds batch {cache_batch} but the inputs have batch {batch}")
    prompt = input_ids.shape[1] if input_ids is not None else 0
    canvas = decoder_input_ids.shape[1] if decoder_input_ids is not None else canvas_length
    if cached + prompt + canvas > max_positions:
        raise ValueError(
            f"cached ({cached}) + input_ids ({prompt}) + canvas ({canvas}) tokens exceed "
            f"max_position_embeddings ({max_positions})"
        )
    encoder_keep = None
    if attention_mask is not None:
        if input_ids is None:
            raise ValueError("`attention_mask` applies to `input_ids`; pass `decoder_attention_mask` for the canvas")
        keep = padding_vector("attention_mask", attention_mask, batch, (prompt, cached + prompt))
        if keep.shape[1] == prompt and cached:
            keep = torch.cat([keep.new_ones(batch, cached), keep], dim=1)
        encoder_keep = keep
    decoder_keep = None
    if decoder_attention_mask is not None:
        total = cached + prompt
        keep = padding_vector("decoder_attention_mask", decoder_attention_mask, batch, (total, total + canvas))
        if not bool(keep[:, total:].all()):
            raise ValueError("`decoder_attention_mask` must be 1 on the canvas positions (the last L columns)")
        decoder_keep = keep[:, :total]
    if self_conditioning_logits is not None:
        expected = (batch, canvas, vocab_size)
        if not isinstance(self_conditioning_logits, torch.Tensor) or tuple(self_conditioning_logits.shape) != expected:
            got = tuple(getattr(self_conditioning_logits, "shape", ()))
            raise ValueError(f"`self_conditioning_logits` must have shape {list(expected)}, got {list(got)}")
    if self_conditioning_mask is not None:
        if not isinstance(self_conditioning_mask, torch.Tensor) or tuple(self_conditioning_mask.shape) != (batch,):
            raise ValueError(f"`self_conditioning_mask` must be a bool tensor of shape [{batch}]")
    return CheckedInputs(batch, encoder_keep, decoder_keep)


# transformers' `attn_implementation` names -> the backends of modeling/attention.py (None: transformers' default)
ATTN_IMPLEMENTATIONS = {"eager": "eager", "sdpa": "sdpa", "flex_attention": "flex"}
EXPERTS_IMPLEMENTATIONS = (None, "grouped_mm", "eager")  # all run modeling/moe.py; see check_experts_implementation


def attention_backend_for(attn_implementation: str | None) -> str:
    """The attention backend ("eager", "sdpa" or "flex") that runs `attn_implementation`; None means "sdpa".

    Raises:
        ValueError: for any other value (flash attention, "paged|...", hub kernels), which our attention cannot run.
    """
    if attn_implementation is None:
        return "sdpa"
    if not isinstance(attn_implementation, str) or attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"`attn_implementation` must be one of {sorted(ATTN_IMPLEMENTATIONS)} (or None for 'sdpa') for "
            f"DiffusionGemmaForBlockDiffusion, got {attn_implementation!r}"
        )
    return ATTN_IMPLEMENTATIONS[attn_implementation]


def check_experts_implementation(experts_implementation: str | None) -> None:
    """Accept transformers' `experts_implementation` switch where our experts compute the same thing.

    Our experts (modeling/moe.py) pick, per call, the arithmetic of the built-in's "grouped_mm" path where that kernel
    runs (CPU or CUDA sm80+, 16-byte aligned rows) and of its "eager" loop elsewhere, so None, "grouped_mm" and
    "eager" are all accepted and all mean that. The built-in's constructor records "grouped_mm" on the config it is
    given, so a config shared with the built-in class arrives here with it set.

    Raises:
        ValueError: for any other value ("batched_mm", the FP8 expert kernels, ...), which has no counterpart here.
    """
    if experts_implementation not in EXPERTS_IMPLEMENTATIONS:
        raise ValueError(
            "`experts_implementation` cannot be chosen for DiffusionGemmaForBlockDiffusion: its experts run "
            "diffusiongemma's own MoE (modeling/moe.py), which picks the built-in's grouped_mm arithmetic where that "
            "kernel runs and its eager loop elsewhere; accepted: None, 'grouped_mm' or 'eager' (all mean that), got "
            f"{experts_implementation!r}."
        )
