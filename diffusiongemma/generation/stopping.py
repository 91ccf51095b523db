"""When to stop denoising a canvas (spec D.5) and when to stop generating (spec D.4.6).

A stopper is a plug-in like a sampler: registered once under its config class (`register_stopper`) and picked by the
generation config's `stopper_config`; without one, the built-in stable-and-confident stopper runs, set by the
config's `stability_threshold` and `confidence_threshold`.

Legend: B batch, L canvas length.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from ..stopper_configs import register_stopper_config


class Stopper(Protocol):
    """When a row's canvas is done denoising (spec D.5). The history a stopper needs lives in the caller's per-row
    state, not on the stopper: `init_state` makes it, every call returns the next one. A state is None or a tensor
    with the batch first, so a row pool can slice it per row (`state[i:i+1]`) and join rows (`torch.cat`)."""

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
        """The state of `batch` rows at the start of a canvas."""

    def __call__(self, argmax_canvas: torch.Tensor, entropy: torch.Tensor, state: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """argmax_canvas [B, L], entropy [B, L] of the tempered logits, state -> ([B] bool: stop now, next state)."""


class BaseStopper:
    """A base for plug-in stoppers: keeps its config and no history (`init_state` gives None). A subclass defines
    `__call__`; one that needs history per row overrides `init_state` too."""

    def __init__(self, config):
        self.config = config

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor | None:
        return None

    def __call__(self, argmax_canvas: torch.Tensor, entropy: torch.Tensor, state: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(argmax_canvas, entropy, state)")


@dataclass(frozen=True)
class StableAndConfidentStopperConfig:
    """The built-in stopper's settings, taken from the generation config's own fields (never set directly)."""

    stability_threshold: int
    confidence_threshold: float


class StableAndConfidentStopper:
    """Stop a row when its argmax canvas equals each of the previous S argmax canvases and its mean entropy is
    below the confidence threshold. With S >= 1 a canvas needs at least S + 1 steps (pitfall H.10).

    The previous S canvases are all equal to the current one exactly when the run of identical argmax canvases
    ending at this step is at least S + 1 long, so the state keeps only the previous canvas and that run's length,
    whatever S is (the reference keeps S canvases: its memory grows with S).

    State: [B, L + 1] long: columns :L the previous argmax canvas (-1: nothing seen yet), column L the length of the
    run of equal canvases ending there; None when S = 0.
    """

    def __init__(self, config: StableAndConfidentStopperConfig):
        self.stability_threshold = config.stability_threshold
        self.confidence_threshold = config.confidence_threshold

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


_STOPPERS: dict[type, type] = {StableAndConfidentStopperConfig: StableAndConfidentStopper}  # config class -> stopper


def register_stopper(config_class: type, stopper_class: type) -> None:
    """Make `stopper_class` the stopper for `stopper_config` instances of `config_class` (the generation config's
    `stopper_config`, or `generate(..., stopper_config=...)`). It is built as `stopper_class(stopper_config)` and
    follows the `Stopper` protocol (`BaseStopper` gives a stateless start). The config class also becomes loadable
    from `generation_config.json` (its `_cls_name`)."""
    if not isinstance(stopper_class, type) or not callable(getattr(stopper_class, "init_state", None)):
        raise TypeError(f"a stopper class needs `init_state(batch, length, device)` and `__call__(argmax_canvas, "
                        f"entropy, state)` (subclass diffusiongemma.BaseStopper), got {stopper_class!r}")
    register_stopper_config(config_class)
    _STOPPERS[config_class] = stopper_class


def stopper_config_of(config):
    """The generation config's stopper config: its plug-in `stopper_config`, or the built-in's from its fields."""
    own = getattr(config, "stopper_config", None)
    if own is not None:
        return own
    return StableAndConfidentStopperConfig(config.stability_threshold, config.confidence_threshold)


def stopper_class_for(stopper_config) -> type:
    """The registered stopper class for this stopper config."""
    stopper_class = _STOPPERS.get(type(stopper_config))
    if stopper_class is None:
        known = sorted(c.__name__ for c in _STOPPERS if c is not StableAndConfidentStopperConfig)
        raise ValueError(f"`stopper_config` is a {type(stopper_config).__name__}, which has no registered stopper "
                         f"(registered: {known}; see diffusiongemma.register_stopper)")
    return stopper_class


def stopper_for(config) -> Stopper:
    """The stopper of a generation config, built in this one place (from the registry)."""
    stopper_config = stopper_config_of(config)
    return stopper_class_for(stopper_config)(stopper_config)


def pad_after_eos(canvas: torch.Tensor, eos_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Every token after the first EOS of each row becomes pad; the first EOS is kept. canvas [B, L]."""
    is_eos = torch.isin(canvas, eos_ids)
    seen = is_eos.cumsum(dim=-1)
    after_first = (seen > 0) & ~((seen == 1) & is_eos)
    return canvas.masked_fill(after_first, pad_id)
