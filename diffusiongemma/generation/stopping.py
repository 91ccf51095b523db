"""When to stop denoising a canvas (spec D.5) and when to stop generating (spec D.4.6).

Legend: B batch, L canvas length.
"""

from typing import Protocol

import torch


class Stopper(Protocol):
    """When a row's canvas is done denoising (spec D.5). The history a stopper needs lives in the caller's per-row
    state, not on the stopper: `init_state` makes it, every call returns the next one. A state is None or a tensor
    with the batch first, so a row pool can slice it per row (`state[i:i+1]`) and join rows (`torch.cat`)."""

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
        """The state of `batch` rows at the start of a canvas."""

    def __call__(self, argmax_canvas: torch.Tensor, entropy: torch.Tensor, state: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """argmax_canvas [B, L], entropy [B, L] of the tempered logits, state -> ([B] bool: stop now, next state)."""


class StableAndConfidentStopper:
    """Stop a row when its argmax canvas equals each of the previous S argmax canvases and its mean entropy is
    below the confidence threshold. With S >= 1 a canvas needs at least S + 1 steps (pitfall H.10).

    The previous S canvases are all equal to the current one exactly when the run of identical argmax canvases
    ending at this step is at least S + 1 long, so the state keeps only the previous canvas and that run's length,
    whatever S is (the reference keeps S canvases: its memory grows with S).

    State: [B, L + 1] long: columns :L the previous argmax canvas (-1: nothing seen yet), column L the length of the
    run of equal canvases ending there; None when S = 0.
    """

    def __init__(self, stability_threshold: int, confidence_threshold: float):
        self.stability_threshold = stability_threshold
        self.confidence_threshold = confidence_threshold

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
        if self.stability_threshold == 0:
            return None
        state = torch.full((batch, length + 1), -1, dtype=torch.long, device=device)
        state[:, length] = 0
        return state

    def __call__(self, argmax_canvas: torch.Tensor, entropy: torch.Tensor, state: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Computed on the device; nothing is read on the host."""
        B = argmax_canvas.shape[0]
        if state is None:
            stable = torch.ones(B, dtype=torch.bool, device=argmax_canvas.device)
        else:
            same = (state[:, :-1] == argmax_canvas).all(dim=-1)  # [B]
            run = torch.where(same, state[:, -1] + 1, 1)  # [B] equal canvases ending at this step
            stable = run > self.stability_threshold  # the previous S all equal this one
            state = torch.cat([argmax_canvas, run[:, None]], dim=1)
        confident = entropy.mean(dim=-1) < self.confidence_threshold
        return stable & confident, state


def stopper_for(config) -> Stopper:
    """The stopper of a generation config, built in this one place."""
    return StableAndConfidentStopper(config.stability_threshold, config.confidence_threshold)


def pad_after_eos(canvas: torch.Tensor, eos_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Every token after the first EOS of each row becomes pad; the first EOS is kept. canvas [B, L]."""
    is_eos = torch.isin(canvas, eos_ids)
    seen = is_eos.cumsum(dim=-1)
    after_first = (seen > 0) & ~((seen == 1) & is_eos)
    return canvas.masked_fill(after_first, pad_id)
