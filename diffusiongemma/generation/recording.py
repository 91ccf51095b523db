"""The seam between `generate` and trace recording: generation imports nothing from `diffusiongemma.accuracy`
(tests/test_layering.py), so accuracy, which owns the trace format, installs its recorder here when it is imported
(importing `diffusiongemma` imports it). The loop only asks for a recorder when `return_trace=True`.

A recorder is an observer of the row pool's pass events: `observe(events)` after every pass (one `pool.PassRecord`
per engine call), `finish(sequences)` once, returning the trace.
"""

from typing import Callable, Protocol

import torch


class StepRecorder(Protocol):
    def observe(self, events) -> None: ...

    def finish(self, sequences: torch.Tensor): ...


_FACTORY: list[Callable] = []  # at most one: (model, run) -> StepRecorder


def install_trace_recorder(factory: Callable) -> None:
    """Make `factory(model, run)` build the recorder of every `return_trace=True` run (accuracy does, on import)."""
    _FACTORY[:] = [factory]


def trace_recorder(model, run) -> StepRecorder:
    """The recorder for this run (its trace settings are in `run`)."""
    if not _FACTORY:
        raise RuntimeError("`return_trace=True` needs diffusiongemma.accuracy, which installs the trace recorder when "
                           "imported; import diffusiongemma first")
    return _FACTORY[0](model, run)
