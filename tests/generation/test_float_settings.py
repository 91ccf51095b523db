"""generation_config.py: every float generation setting must be finite and in range; a bad value is a ValueError
naming the field and the value, raised before any forward pass (no silent NaN temperature or threshold)."""

import math

import pytest
import torch

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig

IDS = torch.tensor([[3, 4, 5]])
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("field, value", [
    ("t_max", INF), ("t_max", NAN), ("t_max", 1e39), ("t_min", NAN), ("t_min", -INF), ("t_min", INF),
    ("t_min", -0.5), ("t_max", "0.8"), ("t_max", True), ("t_min", None or torch.tensor(0.4)),
])
@pytest.mark.parametrize("sampling", ["reference", "fast"])
def test_bad_temperature(model, field, value, sampling):
    with pytest.raises(ValueError, match=f"`{field}` must be a finite number >= 0"):
        model.generate(IDS, sampling=sampling, **{field: value})


@pytest.mark.parametrize("value", [NAN, INF, -INF, 0.0, -0.1, 1, "0.005"])
def test_bad_confidence_threshold(model, value):
    with pytest.raises(ValueError, match=r"`confidence_threshold` must be a finite float > 0, got"):
        model.generate(IDS, confidence_threshold=value)


@pytest.mark.parametrize("value", [-1, 1.5, NAN, "1", False])
def test_bad_stability_threshold(model, value):
    with pytest.raises(ValueError, match="`stability_threshold` must be an integer >= 0"):
        model.generate(IDS, stability_threshold=value)


@pytest.mark.parametrize("value", [NAN, INF, 0.0, -1.0])
def test_bad_entropy_bound_set_after_construction(model, value):
    """The sampler config checks itself on construction only (transformers' dataclass); a bound changed later, or
    NaN/inf (which pass its `<= 0` test), must still be refused when generate validates."""
    bound = EntropyBoundSamplerConfig(entropy_bound=0.1)
    bound.entropy_bound = value
    with pytest.raises(ValueError, match=r"`sampler_config.entropy_bound` must be a finite float > 0, got"):
        model.generate(IDS, sampler_config=bound)


@pytest.mark.parametrize("value", [NAN, INF])
def test_nonfinite_entropy_bound_on_construction(value):
    with pytest.raises(ValueError, match="`sampler_config.entropy_bound` must be a finite float > 0"):
        DiffusionGemmaGenerationConfig(sampler_config=EntropyBoundSamplerConfig(entropy_bound=value))


def test_extreme_but_finite_values_run(model):
    out = model.generate(IDS, sampling="fast", seed=0, t_min=0.0, t_max=1e6, confidence_threshold=1e-30,
                         max_new_tokens=16, max_denoising_steps=2)
    assert out.sequences.shape == (1, 3 + 16)
    assert all(math.isfinite(t) for t in out.tokens_per_forward)
