"""`check_sampler_config` (sampler_configs.py): a sampler config is checked again where it is used, so a field
changed after construction, or corrector passes that do not fit the step budget, are refused naming the field."""

import pytest
import torch
from conftest import tiny_model

from diffusiongemma import (
    BlockRefinementSamplerConfig,
    ConfidenceThresholdSamplerConfig,
    DiffusionGemmaGenerationConfig,
    DiscreteDDIMSamplerConfig,
    EntropyBoundSamplerConfig,
)
from diffusiongemma.generation.discrete_ddim import pass_schedule
from diffusiongemma.generation_config import MAX_DENOISING_STEPS
from diffusiongemma.sampler_configs import check_sampler_config

pytestmark = pytest.mark.usefixtures("one_thread")
KW = dict(max_new_tokens=16, max_denoising_steps=4, eos_token_id=None, pad_token_id=0, seed=1)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("config,field,value,match", [
    (BlockRefinementSamplerConfig(), "threshold", float("nan"), "BlockRefinementSamplerConfig.threshold"),
    (ConfidenceThresholdSamplerConfig(), "factor", -1.0, "ConfidenceThresholdSamplerConfig.factor"),
    (DiscreteDDIMSamplerConfig(), "corrector_k", 0, "DiscreteDDIMSamplerConfig.corrector_k"),
])
def test_a_field_changed_after_construction_is_refused_by_generate(model, config, field, value, match):
    setattr(config, field, value)  # the dataclass's __post_init__ never sees this
    ids = torch.arange(3, 8)[None]
    with pytest.raises(ValueError, match=match):
        model.generate(ids, sampler_config=config, **KW)
    with pytest.raises(ValueError, match=match):  # also when it is the model's own config
        model.generate(ids, generation_config=DiffusionGemmaGenerationConfig(
            sampler_config=DiffusionGemmaGenerationConfig().sampler_config), sampler_config=config, **KW)


def test_entropy_bound_changed_after_construction_is_refused(model):
    config = EntropyBoundSamplerConfig(entropy_bound=0.1)
    config.entropy_bound = float("nan")
    with pytest.raises(ValueError, match="entropy_bound"):
        model.generate(torch.arange(3, 8)[None], sampler_config=config, **KW)


def test_corrector_steps_must_fit_the_step_budget(model):
    # N = 4: c = 2 corrects one step (P0 C0 C0 P1); c = 3 would correct none: K = (4 - 1) // 4 = 0
    assert pass_schedule(4, 2) == [(0, False), (0, True), (0, True), (1, False)]
    assert all(not corrected for _, corrected in pass_schedule(4, 3))
    ids = torch.arange(3, 8)[None]
    model.generate(ids, sampler_config=DiscreteDDIMSamplerConfig(corrector_steps=2), **KW)
    with pytest.raises(ValueError, match="corrector_steps` must be at most max_denoising_steps - 2 = 2") as error:
        model.generate(ids, sampler_config=DiscreteDDIMSamplerConfig(corrector_steps=3), **KW)
    assert "got 3" in str(error.value)
    with pytest.raises(ValueError, match="corrector_steps"):
        check_sampler_config(DiscreteDDIMSamplerConfig(corrector_steps=1), 2)
    check_sampler_config(DiscreteDDIMSamplerConfig(corrector_steps=0), 1)  # plain DDIM fits any budget


def test_corrector_steps_beyond_any_budget_is_refused_at_construction():
    with pytest.raises(ValueError, match=f"corrector_steps` must be at most {MAX_DENOISING_STEPS - 2}"):
        DiscreteDDIMSamplerConfig(corrector_steps=10**12)
