"""Reference mode's exact multinomial (generation/multinomial.py): `fast_multinomial` reproduces
`torch.multinomial(probs, 1)` (the same samples, the same generator state, the same draws afterwards), and the probe
that picks the path logs its choice and falls back to PyTorch's own multinomial, still exact."""

import logging
import math

import pytest
import torch

from diffusiongemma.generation import cpu_rng, multinomial
from diffusiongemma.generation.multinomial import (
    NOISE_CHUNK,
    exact_multinomial,
    fast_multinomial,
    fast_multinomial_is_exact,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_probe_passes_on_this_build():
    assert fast_multinomial_is_exact()


def multinomial_pair(probs: torch.Tensor, generator: torch.Generator | None, setup_seed: int):
    """(torch.multinomial, fast_multinomial) from the same generator state, each followed by 20 randint draws."""
    get = generator.get_state if generator is not None else torch.random.get_rng_state
    put = generator.set_state if generator is not None else torch.random.set_rng_state
    (generator.manual_seed if generator is not None else torch.manual_seed)(setup_seed)
    torch.randint(0, 50, (setup_seed % 3 + 1,), generator=generator)  # other draws before
    start = get()
    expected = torch.multinomial(probs, 1, generator=generator).view(-1)
    after = get()
    expected_next = torch.randint(0, 2**30, (20,), generator=generator)
    put(start)
    got = fast_multinomial(probs, generator)
    got_after = get()
    got_next = torch.randint(0, 2**30, (20,), generator=generator)
    return (expected, after, expected_next), (got, got_after, got_next)


@pytest.mark.parametrize(
    "rows, vocab",
    [(1, 5), (7, 1000), (300, 97), (4, 50_257), (3, 3 * NOISE_CHUNK // 2), (9, 32_768), (2, 262_144)],
)
@pytest.mark.parametrize("use_generator", [False, True])
def test_fast_multinomial_matches_torch(rows, vocab, use_generator):
    g = torch.Generator().manual_seed(rows * vocab)
    probs = (torch.randn(rows, vocab, generator=g) * 3).softmax(-1)
    probs[:, ::11] = 0.0  # impossible tokens
    generator = torch.Generator() if use_generator else None
    (expected, after, expected_next), (got, got_after, got_next) = multinomial_pair(probs, generator, rows + vocab)
    assert torch.equal(got, expected)
    assert torch.equal(got_after, after)
    assert torch.equal(got_next, expected_next)


def test_fast_multinomial_peaked_rows_and_exact_ties():
    # one-hot rows, rows of equal probabilities and duplicated rows: samples and state still match
    probs = torch.zeros(64, 300)
    probs[:16, 7] = 1.0
    probs[16:32] = 1.0 / 300
    probs[32:] = torch.rand(1, 300).softmax(-1)
    (expected, after, _), (got, got_after, _) = multinomial_pair(probs, None, 4)
    assert torch.equal(got, expected) and torch.equal(got_after, after)
    assert bool((got[:16] == 7).all())


@pytest.mark.parametrize("bad", ["negative", "nan", "inf", "zero_row"])
def test_fast_multinomial_rejects_what_torch_rejects(bad):
    probs = torch.rand(4, 20)
    if bad == "zero_row":
        probs[2] = 0.0
    else:
        probs[1, 3] = {"negative": -0.1, "nan": math.nan, "inf": math.inf}[bad]
    with pytest.raises(RuntimeError) as expected:
        torch.multinomial(probs, 1)
    with pytest.raises(RuntimeError) as got:
        fast_multinomial(probs)
    assert str(got.value) == str(expected.value)


LOGGER = "diffusiongemma.generation.multinomial"


@pytest.fixture
def fresh_probe(monkeypatch):
    """Forget the once-per-process probe result, so the test sees the probe run (and log)."""
    monkeypatch.setattr(multinomial, "_FAST_MULTINOMIAL", [])


def test_probe_logs_the_fast_path_once(fresh_probe, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    assert fast_multinomial_is_exact() and fast_multinomial_is_exact()
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 1 and "cpu_rng's exact multinomial" in messages[0]
    assert caplog.records[0].levelno == logging.INFO


@pytest.mark.parametrize("failure", ["raises", "noise_differs"])
def test_failed_probe_warns_with_the_reason_and_stays_exact(fresh_probe, caplog, monkeypatch, failure):
    def broken():
        if failure == "raises":
            raise OSError("no libm here")
        return False

    monkeypatch.setattr(cpu_rng, "exponential_matches_torch", broken)
    caplog.set_level(logging.INFO, logger=LOGGER)
    state = torch.random.get_rng_state()
    assert not fast_multinomial_is_exact()
    assert torch.equal(torch.random.get_rng_state(), state)  # the probe leaves the global RNG alone
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING and "uses torch.multinomial" in record.getMessage()
    reason = "raised OSError: no libm here" if failure == "raises" else "exponential noise differs"
    assert reason in record.getMessage()
    # the fallback is PyTorch's own multinomial (in row blocks): the same samples and the same RNG draws
    probs = (torch.randn(40, 300, generator=torch.Generator().manual_seed(0)) * 3).softmax(-1)
    torch.manual_seed(5)
    expected = torch.multinomial(probs, 1).view(-1)
    after = torch.random.get_rng_state()
    torch.manual_seed(5)
    assert torch.equal(exact_multinomial(probs, rows_per_block=7), expected)
    assert torch.equal(torch.random.get_rng_state(), after)
