"""The sampler math both samplers share (generation/entropy_bound.py): pure functions on hand-built logits."""

import math

import pytest
import torch

from diffusiongemma.generation.entropy_bound import (
    entropy_bound_accept,
    first_argmax,
    renoise,
    temperature_at,
    temperature_schedule,
    token_entropy,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_temperature_at_counts_steps_remaining():
    # T = 0.4 + 0.4 * n / 4: n = 4 -> 0.8 (first step), n = 1 -> 0.5 (last step, never t_min)
    assert temperature_at(4, 4, 0.4, 0.8).item() == pytest.approx(0.8)
    assert temperature_at(1, 4, 0.4, 0.8).item() == pytest.approx(0.5)
    assert temperature_at(1, 4, 0.4, 0.8).dtype == torch.float32


def test_token_entropy_hand_values():
    logits = torch.tensor([[0.0, 0.0], [0.0, -math.inf], [0.0, math.log(3.0)]])
    # [0, 0]: p = (1/2, 1/2) -> ln 2 = 0.693147
    # [0, -inf]: p = (1, 0) -> 0 (the -inf log-prob is clamped, so 0 * finite = 0, not NaN)
    # [0, ln 3]: p = (1/4, 3/4) -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    expected = torch.tensor([0.693147, 0.0, 0.562335])
    torch.testing.assert_close(token_entropy(logits), expected, atol=1e-6, rtol=0)


def test_entropy_bound_accept_is_a_prefix_of_the_ranking():
    entropy = torch.tensor([[0.3, 0.01, 0.05]])
    # ascending: 0.01 (pos 1), 0.05 (pos 2), 0.3 (pos 0); exclusive cumsums 0, 0.01, 0.06
    assert entropy_bound_accept(entropy, 0.1).tolist() == [[True, True, True]]  # 0.06 <= 0.1
    assert entropy_bound_accept(entropy, 0.03).tolist() == [[False, True, True]]  # 0.06 > 0.03
    assert entropy_bound_accept(entropy, 0.005).tolist() == [[False, True, False]]  # lowest always accepted


def test_renoise_never_keeps_the_previous_canvas():
    sample, noise = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 2, 3]])
    accepted = torch.tensor([[True, False, True]])
    assert renoise(sample, accepted, noise).tolist() == [[5, 2, 7]]


def test_temperature_schedule_holds_the_same_fp32_values():
    schedule = temperature_schedule(6, 0.4, 0.8, torch.device("cpu"))
    assert schedule.dtype == torch.float32 and schedule.shape == (7,)
    for n in range(1, 7):  # bit-identical to the value the reference divides by at step n
        assert torch.equal(schedule[n], temperature_at(n, 6, 0.4, 0.8))


def test_first_argmax_matches_torch_argmax_including_ties():
    x = torch.randint(0, 3, (64, 2048)).float()  # many ties, across and inside blocks of 1024
    x[5] = 0.0
    x[6, 1500] = 9.0
    assert torch.equal(first_argmax(x), x.argmax(-1))
    y = torch.randn(4, 100)  # 100 has no power-of-two divisor >= 32: one block
    assert torch.equal(first_argmax(y), y.argmax(-1))
