"""generation/stopping.py: the stability stopper keeps O(L) state whatever `stability_threshold` is, and stops exactly
when the reference's S-canvas history would (spec D.5)."""

import pytest
import torch

from diffusiongemma.generation.stopping import StableAndConfidentStopper
from diffusiongemma.generation.stopping import StableAndConfidentStopperConfig as Settings


def history_stops(canvases: list[torch.Tensor], S: int) -> list[list[bool]]:
    """The reference rule written out: stable at step k when canvases k-S..k-1 all exist and equal canvas k."""
    out = []
    for k, c in enumerate(canvases):
        out.append([k >= S and all(torch.equal(canvases[j][b], c[b]) for j in range(k - S, k))
                    for b in range(c.shape[0])])
    return out


@pytest.mark.parametrize("S", [0, 1, 2, 3, 7])
def test_run_length_state_equals_the_history_rule(S):
    g = torch.Generator().manual_seed(S)
    B, L, steps = 3, 5, 24
    canvases, c = [], torch.randint(0, 3, (B, L), generator=g)
    for _ in range(steps):  # canvases that often repeat, in runs of different lengths per row
        change = torch.rand(B, generator=g) < 0.35
        c = torch.where(change[:, None], torch.randint(0, 3, (B, L), generator=g), c)
        canvases.append(c)
    stopper = StableAndConfidentStopper(Settings(S, confidence_threshold=1.0))
    state = stopper.init_state(B, L, torch.device("cpu"))
    entropy = torch.zeros(B, L)  # always confident: only stability decides
    got = []
    for c in canvases:
        stop, state = stopper(c, entropy, state)
        got.append(stop.tolist())
    assert got == history_stops(canvases, S)


def test_state_does_not_grow_with_the_threshold():
    small = StableAndConfidentStopper(Settings(1, 0.1)).init_state(2, 16, torch.device("cpu"))
    huge = StableAndConfidentStopper(Settings(100_000, 0.1)).init_state(2, 16, torch.device("cpu"))
    assert small.shape == huge.shape == (2, 17)
    stopper = StableAndConfidentStopper(Settings(100_000, 1.0))
    stop, _ = stopper(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16), huge)
    assert not stop.any()
