"""Every file format that names modules names them as transformers' built-in class does.

Quantization configs (`ignore` / `targets`), `device_map` keys, `tp_plan` / `ep_plan` keys and PEFT target names are
written by tools that run on the built-in class. A module of ours that is renamed, or that changes what it is to
`isinstance` (the vision wrappers did), silently stops matching them; these tests compare names against a tiny
built-in model. The built-in class holds the text stack twice; its encoder copy (`model.encoder.language_model.*`)
is our one stack (`modeling/weights.py`), so its names are compared after that renaming.
"""

import re

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.utils import match_named_modules
from peft import LoraConfig, get_peft_model

from conftest import tiny_builtin, tiny_model
from diffusiongemma.modeling.weights import ENCODER_LAYOUT_MAPPING, checkpoint_names, renamed_key
from diffusiongemma.quantization.schemes import quantization_plan
from vision_builders import tiny_vision_config

GEMMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def models():
    config = tiny_vision_config()
    return tiny_builtin(config), tiny_model(config)


def ours_name(name: str) -> str:
    """A built-in module or parameter name -> ours (the encoder-side text stack is our one stack)."""
    return renamed_key(name, ENCODER_LAYOUT_MAPPING)


def names_of(model) -> set[str]:
    return {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters(remove_duplicate=False)} | {
        n for n, _ in model.named_buffers(remove_duplicate=False)}


def holding_modules(model) -> set[str]:
    """Names of the modules that hold a checkpoint tensor (themselves or below): what a `device_map` places
    (parameterless activation modules, `act_fn`, and the built-in's `rotary_emb`, whose `inv_freq` is computed,
    never loaded, are left out)."""
    held = set(model.state_dict(keep_vars=True))
    return {name for name, _ in model.named_modules()
            if any(h == name or h.startswith(name + ".") or name == "" for h in held)}


def test_every_builtin_module_name_is_one_of_ours(models):
    """So a `device_map` (or any module-keyed dict) written for the built-in class places our modules, and ours
    places the built-in's."""
    builtin, ours = models
    mine = {n for n, _ in ours.named_modules()}
    missing = sorted(n for n in holding_modules(builtin) if ours_name(n) not in mine)
    assert not missing
    assert holding_modules(ours) <= {n for n, _ in builtin.named_modules()}


def test_quantization_targets_match_the_same_linears(models):
    """`targets: ["Linear"]`, no ignore: compressed-tensors on the built-in class and our plan pick the same modules
    (by either checkpoint name), the vision tower's `.linear` children and never our wrappers."""
    builtin, ours = models
    expected = {n for n, _ in match_named_modules(builtin, ["Linear"], [])}
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])})
    got = {n for name in quantization_plan(ours, config) for n in checkpoint_names(name)}
    assert got == expected
    assert "model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj.linear" in got


def test_the_ignore_list_the_library_writes_for_the_builtin_class_names_our_modules(models):
    builtin, ours = models
    mine = {n for name, _ in ours.named_modules() for n in checkpoint_names(name)}
    written = [n for n, _ in builtin.named_modules() if isinstance(_, torch.nn.Linear)]
    assert written and all(n in mine for n in written)


def test_device_map_keys_of_our_automatic_maps_are_builtin_names(models, tmp_path):
    """Our `device_map="auto"` (loading/offload.py) writes `hf_device_map`; its keys name built-in modules."""
    from diffusiongemma.loading.offload import pinned_device_map

    builtin, ours = models
    budget = sum(p.numel() * 4 for p in ours.parameters()) // 4
    device_map = pinned_device_map(ours, "auto", {"cpu": budget}, torch.float32)
    assert len(set(device_map.values())) > 1  # a real split
    theirs = {n for n, _ in builtin.named_modules()} | names_of(builtin)
    assert all(k in theirs for k in device_map), sorted(k for k in device_map if k not in theirs)


def _plan_matches(pattern: str, names: set[str]) -> bool:
    regex = re.compile("^" + re.escape(pattern).replace(r"\*", r"\d+") + "$")
    return any(regex.match(n) for n in names)


@pytest.mark.parametrize("plan", ["_tp_plan", "_ep_plan"])
def test_parallel_plan_keys_match_the_same_modules(models, plan):
    builtin, ours = models
    mine, theirs = names_of(ours), names_of(builtin)
    builtin_plan, our_plan = getattr(builtin, plan) or {}, getattr(ours, plan) or {}
    assert our_plan
    # a plan written for the built-in class reaches our modules ...
    assert all(_plan_matches(ours_name(k), mine) for k in builtin_plan), builtin_plan
    # ... and ours names modules of the built-in class, with the style it gives them
    for key, style in our_plan.items():
        assert _plan_matches(key, theirs), key
        assert builtin_plan.get(key, builtin_plan.get(key.replace("model.decoder.", "model.encoder.language_model.")
                                                      , style)) == style, key


def test_peft_targets_adapt_modules_of_the_same_names(models):
    """The Gemma target list wraps modules whose names the built-in class has (text Linears; the vision wrappers,
    which the built-in class also names `q_proj` ... but PEFT cannot adapt there)."""
    builtin, ours = models
    adapted = {n.removesuffix(".lora_A") for n, _ in
               get_peft_model(ours, LoraConfig(r=2, target_modules=GEMMA_TARGETS)).named_modules()
               if n.endswith(".lora_A")}
    theirs = {n for n, _ in builtin.named_modules()}
    names = {n.removeprefix("base_model.model.") for n in adapted}
    assert names and all(n in theirs for n in names), sorted(names - theirs)
    assert any(".vision_tower." in n and n.endswith("q_proj") for n in names)
