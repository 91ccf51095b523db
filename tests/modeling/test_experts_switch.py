"""transformers' `experts_implementation` switch and configs shared with the built-in class
(modeling/validation.py `check_experts_implementation`, model.py `_check_and_adjust_experts_implementation`)."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

from conftest import pair, tiny_config
from diffusiongemma import DiffusionGemmaForBlockDiffusion



@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("experts")
    builtin, ours = pair(path, seed=5)
    return path, builtin, ours


def logits(model):
    g = torch.Generator().manual_seed(0)
    ids, canvas = torch.randint(3, 128, (1, 9), generator=g), torch.randint(0, 128, (1, 16), generator=g)
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=canvas).logits


def test_config_the_builtin_was_built_from_builds_ours():
    config = tiny_config()
    BuiltinModel(config)
    assert config.get_text_config()._experts_implementation == "grouped_mm"  # the built-in marks the config
    model = DiffusionGemmaForBlockDiffusion(config)
    assert torch.isfinite(logits(model.eval())).all()


def test_ours_leaves_a_shared_config_to_the_builtins_default():
    config = tiny_config()
    DiffusionGemmaForBlockDiffusion(config)
    assert config._experts_implementation is None
    BuiltinModel(config)
    assert config._experts_implementation == "grouped_mm"


def test_shared_config_loads_both_classes_with_equal_logits(folder):
    path, _, _ = folder
    config = BuiltinModel.config_class.from_pretrained(path)
    builtin = BuiltinModel.from_pretrained(path, config=config).eval()
    ours = DiffusionGemmaForBlockDiffusion.from_pretrained(path, config=config).eval()
    torch.testing.assert_close(logits(ours), logits(builtin), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["grouped_mm", "eager"])
def test_switch_values_we_run_are_accepted_and_change_nothing(folder, impl):
    path, _, ours = folder
    for cls in (DiffusionGemmaForBlockDiffusion, AutoModelForCausalLM):
        model = cls.from_pretrained(path, experts_implementation=impl).eval()
        assert type(model) is DiffusionGemmaForBlockDiffusion
        torch.testing.assert_close(logits(model), logits(ours), rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["batched_mm", "deepgemm"])
def test_other_values_are_refused_with_what_we_do_instead(folder, impl):
    path, _, _ = folder
    message = rf"runs? .*modeling/moe.py.*accepted: None, 'grouped_mm' or 'eager'.*got '{impl}'"
    with pytest.raises(ValueError, match=message):
        DiffusionGemmaForBlockDiffusion.from_pretrained(path, experts_implementation=impl)
    with pytest.raises(ValueError, match=message):
        DiffusionGemmaForBlockDiffusion._from_config(tiny_config(), experts_implementation=impl)

