"""Named sampler presets (generation/sampler_presets.py): one per built-in sampler, each a config of that sampler
that round-trips through generation_config.json and runs in every batching mode; an unknown name lists them."""

import pytest
import torch
from conftest import tiny_model

import diffusiongemma
from diffusiongemma import DiffusionGemmaGenerationConfig, sampler_preset
from diffusiongemma.generation.sampler_settings import SAMPLER_NAMES

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_preset_per_built_in_sampler_each_its_config():
    assert set(diffusiongemma.SAMPLER_PRESETS) == set(SAMPLER_NAMES)
    for name, config_class in SAMPLER_NAMES.items():
        assert type(sampler_preset(name)) is config_class


def test_a_preset_is_a_fresh_copy():
    mine = sampler_preset("block-refinement")
    mine.threshold = 0.1
    assert sampler_preset("block-refinement").threshold != 0.1
    assert diffusiongemma.SAMPLER_PRESETS["block-refinement"].threshold != 0.1


def test_unknown_preset_names_the_argument_and_lists_the_presets():
    with pytest.raises(ValueError, match="unknown sampler preset 'fast'; presets: entropy-bound, block-refinement"):
        sampler_preset("fast")
    with pytest.raises(ValueError) as error:
        sampler_preset(None, field="--sampler-preset")
    assert error.value.field == "--sampler-preset"


@pytest.mark.parametrize("name", list(SAMPLER_NAMES))
def test_preset_round_trips_through_generation_config(tmp_path, name):
    DiffusionGemmaGenerationConfig(sampler_config=sampler_preset(name)).save_pretrained(tmp_path)
    assert DiffusionGemmaGenerationConfig.from_pretrained(tmp_path).sampler_config == sampler_preset(name)


@pytest.mark.parametrize("name", list(SAMPLER_NAMES))
def test_preset_runs_in_lockstep_and_mixed_with_the_same_tokens(name):
    model = tiny_model()
    ids = torch.randint(4, 100, (3, 6), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=32, max_denoising_steps=4, sampler_config=sampler_preset(name), sampling="fast",
              seed=3, eos_token_id=None)
    lock = model.generate(ids, batching="lockstep", **kw).sequences
    mixed = model.generate(ids, batching="mixed", **kw).sequences
    assert lock.shape == (3, 38) and torch.equal(lock, mixed)


def test_the_preset_table_is_read_only_and_hands_out_copies():
    table = diffusiongemma.SAMPLER_PRESETS
    entry = table["block-refinement"]
    entry.threshold = 0.1  # the caller's own copy
    assert table["block-refinement"].threshold == 0.95 and sampler_preset("block-refinement").threshold == 0.95
    table["discrete-ddim"].corrector_steps = 5
    assert table["discrete-ddim"].corrector_steps == 0
    with pytest.raises(TypeError):
        table["block-refinement"] = entry
    with pytest.raises(TypeError):
        del table["block-refinement"]
    assert list(table) == list(SAMPLER_NAMES) and len(table) == 4 and table.get("nope") is None
