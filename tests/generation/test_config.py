"""Generation settings: resolution order (spec D.1) and clear errors for bad values."""

import pytest
import torch

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
from diffusiongemma.generation.config import resolve_generation_config


@pytest.fixture(scope="module")
def model():
    return tiny_model()


IDS = torch.randint(3, 128, (1, 4))


@pytest.mark.parametrize("kwargs,message", [
    (dict(max_denoising_steps=0), "`max_denoising_steps` must be a positive integer, got 0"),
    (dict(max_denoising_steps=2.5), "`max_denoising_steps` must be a positive integer"),
    (dict(max_denoising_steps=True), "`max_denoising_steps` must be a positive integer"),
    (dict(max_new_tokens=-1), "`max_new_tokens` must be a positive integer"),
    (dict(max_length=0), "`max_length` must be a positive integer"),
    (dict(t_min=0.5, t_max=0.5), "`t_max` must be greater than `t_min`"),
    (dict(t_min=0.9, t_max=0.5), "`t_max` must be greater than `t_min`"),
    (dict(t_min=-0.1), "`t_min` must be a finite number >= 0"),
    (dict(stability_threshold=-1), "`stability_threshold` must be an integer >= 0"),
    (dict(confidence_threshold=0.0), "`confidence_threshold` must be a finite float > 0"),
    (dict(confidence_threshold=-1.0), "`confidence_threshold` must be a finite float > 0"),
    (dict(sampler_config="entropy"), "`sampler_config` must be a registered sampler config"),
    (dict(cache_implementation="static"), "`cache_implementation` must be None or 'dynamic'"),
    (dict(top_k=5), r"unknown keyword arguments \['top_k'\]"),
    (dict(max_length=3), r"`max_length` \(3\) must exceed the prompt length"),
    (dict(max_length=40, max_new_tokens=16), "Pass only one of `max_length` and `max_new_tokens`"),
    (dict(max_new_tokens=2000), "exceed max_position_embeddings"),
    (dict(decoder_input_ids=torch.zeros(1, 5, dtype=torch.long)), r"`decoder_input_ids` must have shape \[1, 16\]"),
    (dict(self_conditioning_logits=torch.zeros(1, 16, 3)), r"`self_conditioning_logits` must have shape"),
    (dict(attention_mask=torch.ones(1, 3)), r"`attention_mask` must have shape \[1, 4\]"),
    (dict(sampling="greedy"), "`sampling` must be one of"),
])
def test_generate_errors(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        model.generate(IDS, **kwargs)


def test_entropy_bound_must_be_a_positive_float():
    with pytest.raises(ValueError, match="entropy_bound"):
        EntropyBoundSamplerConfig(entropy_bound=0.0)


def test_bad_token_ids_in_generate(model):
    with pytest.raises(ValueError, match="`input_ids` holds token ids outside the vocabulary"):
        model.generate(torch.tensor([[1, 500]]))
    with pytest.raises(ValueError, match=r"`input_ids` must have shape \[batch, length\]"):
        model.generate(torch.tensor([1, 2]))


def test_resolution_order():
    model_config = DiffusionGemmaGenerationConfig(max_denoising_steps=7, t_min=0.1, t_max=0.2)
    explicit = DiffusionGemmaGenerationConfig(t_max=0.9)
    config, rest, _ = resolve_generation_config(model_config, explicit, {"t_min": 0.3, "decoder_input_ids": 1})
    assert config.max_denoising_steps == 7  # filled from the model's config
    assert config.t_max == 0.9  # the explicit config wins over the model's
    assert config.t_min == 0.3  # kwargs win over both
    assert config.stability_threshold == 1 and config.confidence_threshold == 0.005  # global defaults
    assert config.sampler_config.entropy_bound == 0.1
    assert rest == {"decoder_input_ids": 1}
    assert model_config.t_min == 0.1  # not mutated


def test_saved_config_loads_in_transformers(tmp_path):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig as Builtin,
    )

    ours = DiffusionGemmaGenerationConfig(max_denoising_steps=12, sampler_config=EntropyBoundSamplerConfig(0.2),
                                          eos_token_id=[1, 106], pad_token_id=0)
    ours.save_pretrained(tmp_path)
    theirs = Builtin.from_pretrained(tmp_path)
    assert theirs.max_denoising_steps == 12 and theirs.sampler_config.entropy_bound == 0.2
    again = DiffusionGemmaGenerationConfig.from_pretrained(tmp_path)
    assert again.eos_token_id == [1, 106]


def test_foreign_cache_is_rejected_by_generate(model):
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="BlockDiffusionCache"):
        model.generate(IDS, past_key_values=DynamicCache())


def test_generate_continues_a_cache(model):
    """A prompt encoded earlier continues: the new ids start at the cached length."""
    torch.manual_seed(0)
    first = model.generate(IDS, max_new_tokens=16, max_denoising_steps=2)
    cache = first.past_key_values
    assert cache.get_seq_length() == IDS.shape[1]  # the last canvas is never committed (spec D.6)
    more = torch.randint(3, 128, (1, 3))
    out = model.generate(more, past_key_values=cache, max_new_tokens=16, max_denoising_steps=2)
    assert out.sequences.shape == (1, 3 + 16)
    assert out.past_key_values.get_seq_length() == IDS.shape[1] + 3


def test_builtin_generation_config_object_is_accepted(model):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig as Builtin,
    )

    torch.manual_seed(0)
    out = model.generate(IDS, generation_config=Builtin(max_new_tokens=32, max_denoising_steps=2))
    assert out.sequences.shape == (1, 4 + 32)
