"""The seam between `generate` and trace recording (generation/recording.py): accuracy installs its recorder on
import; without one, `return_trace=True` says what is missing."""

import pytest
import torch

from conftest import tiny_model

from diffusiongemma.accuracy.record import TraceRecorder
from diffusiongemma.generation import recording


def test_accuracy_installs_its_recorder_and_generate_uses_it(monkeypatch):
    assert recording._FACTORY == [TraceRecorder]
    seen = []

    class Spy(TraceRecorder):
        def record_step(self, record):  # one `pool.PassRecord` per engine call of a pass
            seen.append(record.canvas.shape)
            super().record_step(record)

    monkeypatch.setattr(recording, "_FACTORY", [Spy])
    torch.manual_seed(0)
    out = tiny_model().generate(torch.arange(3, 8)[None], return_trace=True, max_new_tokens=16, max_denoising_steps=3)
    assert seen and len(seen) == out.trace.tensors["canvas_index"].shape[0]


def test_without_a_recorder_return_trace_names_the_missing_part(monkeypatch):
    monkeypatch.setattr(recording, "_FACTORY", [])
    with pytest.raises(RuntimeError, match="diffusiongemma.accuracy"):
        tiny_model().generate(torch.arange(3, 8)[None], return_trace=True, max_new_tokens=16, max_denoising_steps=3)
