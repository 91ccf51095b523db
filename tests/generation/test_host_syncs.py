"""A fast lock-step pass of the row pool (generation/pool.py + lockstep.py: decoder, LM head, processors, temperature,
sampler, acceptance, self-conditioning, the stopping decision) reads the device once: the stop and fault flags of
the rows that sampled; a pass that ends a canvas reads the [B] finished flags once more. On a GPU everything else
queues kernels without waiting.

Syncs are counted on CPU by patching the tensor methods that would copy a device value to the host
(tests/sync_count.py). Every `RowPool.step` is counted on its own; syncs made while the model runs (`model.denoise`,
`model.encode`: modeling code) are counted apart from the generation code's.
"""

from dataclasses import dataclass, field

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.generation.lockstep import Lockstep
from diffusiongemma.generation.pool import RowPool
from sync_count import count_host_syncs

pytestmark = pytest.mark.usefixtures("one_thread")
B, P = 3, 6
KW = dict(sampling="fast", batching="lockstep", seed=[1, 2, 3], max_new_tokens=64, max_denoising_steps=6,
          eos_token_id=7, pad_token_id=0)


@dataclass
class PassSyncs:
    generation: list = field(default_factory=list)  # per pass: syncs outside the model
    model: list = field(default_factory=list)  # per pass: syncs inside model.denoise / model.encode
    commits: list = field(default_factory=list)  # per pass: whether it ended a canvas
    rows: list = field(default_factory=list)  # per denoising pass: rows that ran the head and sampler


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture
def pass_syncs(model, monkeypatch):
    """Wrap `RowPool.step` (and, inside it, the model's passes) to count the syncs of every pass."""
    record = PassSyncs()
    real_step, real_denoise = RowPool.step, Lockstep.denoise
    inside = []

    def counted(fn):
        def wrapper(*args, **kwargs):
            with count_host_syncs() as syncs:
                out = fn(*args, **kwargs)
            inside.append(syncs.total)
            return out

        return wrapper

    def counted_step(pool):
        with count_host_syncs() as syncs:
            events = real_step(pool)
        record.model.append(sum(inside))
        record.generation.append(syncs.total - sum(inside))
        record.commits.append(bool(events.committed))
        inside.clear()
        return events

    def denoise(self, pool, rows, out, events):
        record.rows.append(list(out.sampled))
        return real_denoise(self, pool, rows, out, events)

    monkeypatch.setattr(RowPool, "step", counted_step)
    monkeypatch.setattr(Lockstep, "denoise", denoise)
    monkeypatch.setattr(model, "denoise", counted(model.denoise))
    monkeypatch.setattr(model, "encode", counted(model.encode))
    return record


def prompts() -> torch.Tensor:
    return torch.randint(3, 128, (B, P), generator=torch.Generator().manual_seed(0))


def test_fast_lockstep_pass_reads_the_device_once(model, pass_syncs):
    out = model.generate(prompts(), return_dict_in_generate=True, **KW)
    denoising = len(pass_syncs.rows)
    canvases = (out.sequences.shape[1] - P) // model.canvas_length
    assert denoising >= 2 * canvases  # a canvas takes at least 2 steps
    # encoder passes read nothing; a denoising pass reads its flags once, and once more when it ends the canvas
    expected = [0] * canvases + [1] * (denoising - canvases) + [2] * canvases
    assert sorted(pass_syncs.generation) == sorted(expected)
    assert sum(pass_syncs.commits) == canvases
    assert pass_syncs.model == [0] * len(pass_syncs.model)
    # the skip path ran too: some passes sampled only the rows still denoising
    assert any(0 < len(rows) < B for rows in pass_syncs.rows), pass_syncs.rows


def test_fast_lockstep_pass_with_left_padding(model, pass_syncs):
    mask = torch.ones(B, P, dtype=torch.long)
    mask[1, :2] = 0
    model.generate(prompts(), attention_mask=mask, **KW)
    assert pass_syncs.rows
    assert max(pass_syncs.generation) <= 2  # the generation code reads only its flags (and, per canvas, finished)
    denoise_passes = [m for m, c in zip(pass_syncs.model, pass_syncs.generation) if c]
    assert denoise_passes == [0] * len(denoise_passes)  # the padding's slots were read before the first step
