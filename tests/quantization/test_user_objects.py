"""Loading never changes the objects the user passed in: `config=` and `quantization_config=BitsAndBytesConfig`
(diffusiongemma/loading/bnb.py, offload.py, loader.py), so they can be reused for another model."""

import copy

import pytest

from conftest import tiny_config, tiny_model
from ct_checkpoint import REGEX_IGNORE, write_compressed_checkpoint
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.loading.bnb import DEFAULT_SKIP_MODULES, with_diffusiongemma_defaults


def snapshot(obj) -> dict:
    """Every attribute, sub-configs included (a config's `to_dict` hides the private ones)."""
    return {k: snapshot(v) if hasattr(v, "__dict__") and "Config" in type(v).__name__ else copy.deepcopy(v)
            for k, v in vars(obj).items()}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    tiny_model(tiny_config(intermediate_size=128, head_dim=32, global_head_dim=64), seed=4).save_pretrained(path)
    return path


def test_with_diffusiongemma_defaults_copies():
    from transformers import BitsAndBytesConfig

    user = BitsAndBytesConfig(load_in_8bit=True)
    before = snapshot(user)
    ours = with_diffusiongemma_defaults(user)
    assert ours.llm_int8_skip_modules == DEFAULT_SKIP_MODULES
    assert snapshot(user) == before and user.llm_int8_skip_modules is None
    mine = BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=["lm_head"])
    assert with_diffusiongemma_defaults(mine).llm_int8_skip_modules == ["lm_head"]


def test_bitsandbytes_config_is_unchanged_by_from_pretrained(dense):
    bnb = pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    user = BitsAndBytesConfig(load_in_8bit=True)
    before = snapshot(user)
    try:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(dense, quantization_config=user, device_map="cpu")
    except (RuntimeError, NotImplementedError) as err:  # a bitsandbytes build without CPU kernels
        pytest.skip(f"bitsandbytes {bnb.__version__} cannot load int8 on this CPU: {err}")
    assert type(model.model.decoder.layers[0].self_attn.q_proj).__name__ == "Linear8bitLt"
    assert type(model.lm_head).__name__ == "Linear"  # our skip list was applied, to a copy
    assert snapshot(user) == before


@pytest.mark.parametrize("kwargs", [dict(device_map="auto"), dict(attn_implementation="eager", dtype="float32")])
def test_config_is_unchanged_by_from_pretrained(dense, kwargs):
    config = DiffusionGemmaForBlockDiffusion.config_class.from_pretrained(dense)
    before = snapshot(config)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(dense, config=config, **kwargs)
    assert model.config is not config
    assert snapshot(config) == before


def test_config_is_unchanged_by_the_compressed_tensors_loader(tmp_path):
    write_compressed_checkpoint(tiny_model(seed=3), tmp_path, "FP8_DYNAMIC", REGEX_IGNORE)
    config = DiffusionGemmaForBlockDiffusion.config_class.from_pretrained(tmp_path)
    before = snapshot(config)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, config=config, attn_implementation="eager")
    assert model.attention_backend == "eager"
    assert snapshot(config) == before
