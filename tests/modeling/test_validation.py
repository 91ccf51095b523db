"""Bad input to forward gets an error naming the argument and what was expected."""

import pytest
import torch

from conftest import tiny_config, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_config(max_position_embeddings=64))


IDS = torch.randint(3, 128, (2, 6))
CANVAS = torch.randint(0, 128, (2, 16))


@pytest.mark.parametrize("kwargs,message", [
    (dict(input_ids=IDS[0], decoder_input_ids=CANVAS), r"`input_ids` must have shape \[batch, length\]"),
    (dict(input_ids=IDS.float(), decoder_input_ids=CANVAS), "`input_ids` must hold integer token ids"),
    (dict(input_ids=IDS + 200, decoder_input_ids=CANVAS), r"`input_ids` holds token ids outside the vocabulary \[0, 128\)"),
    (dict(input_ids=torch.tensor([[5, -1]] * 2), decoder_input_ids=CANVAS), r"outside the vocabulary \[0, 128\): min -1"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS[:1]), "`decoder_input_ids` has batch 1 but `input_ids` has batch 2"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS, attention_mask=torch.ones(2, 5)), r"`attention_mask` must have shape \[2, 6\]"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS, attention_mask=torch.full((2, 6), 2)), "only 0 and 1"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS, self_conditioning_logits=torch.zeros(2, 16, 7)),
     r"`self_conditioning_logits` must have shape \[2, 16, 128\]"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS, self_conditioning_mask=torch.ones(3, dtype=torch.bool)),
     "`self_conditioning_mask` must be a bool tensor of shape"),
    (dict(input_ids=torch.randint(3, 128, (1, 60)), decoder_input_ids=CANVAS[:1]), "exceed max_position_embeddings"),
    (dict(decoder_input_ids=CANVAS), "Either `input_ids` or `past_key_values`"),
    (dict(input_ids=IDS, decoder_input_ids=CANVAS, decoder_attention_mask=torch.zeros(2, 22)),
     "must be 1 on the canvas positions"),
])
def test_forward_errors(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_unknown_forward_kwarg(model):
    with pytest.raises(TypeError, match="unexpected keyword arguments: \\['canvas'\\]"):
        model(input_ids=IDS, canvas=CANVAS)


def test_foreign_cache_is_rejected(model):
    from transformers import DynamicCache

    with pytest.raises(TypeError, match="BlockDiffusionCache"):
        model(past_key_values=DynamicCache(), decoder_input_ids=CANVAS)


# ---- attn_implementation / experts_implementation (validation.py, checked by the model at load and set time) ----

from diffusiongemma import DiffusionGemmaForBlockDiffusion  # noqa: E402
from diffusiongemma.modeling.validation import attention_backend_for, check_experts_implementation  # noqa: E402

# accepted by transformers for this class, but not runnable by our attention (it used to become sdpa silently)
UNSUPPORTED_ATTN = ["paged|eager", "flash_attention_2", "bogus"]
ATTN_MESSAGE = r"`attn_implementation` must be one of \['eager', 'flex_attention', 'sdpa'\]"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_model(tiny_config()).save_pretrained(path)
    return path


def test_attention_backend_for_maps_transformers_names():
    assert attention_backend_for(None) == "sdpa"
    assert [attention_backend_for(x) for x in ("eager", "sdpa", "flex_attention")] == ["eager", "sdpa", "flex"]
    for bad in UNSUPPORTED_ATTN + ["flex", 3]:
        with pytest.raises(ValueError, match=ATTN_MESSAGE):
            attention_backend_for(bad)


@pytest.mark.parametrize("impl", UNSUPPORTED_ATTN)
def test_unsupported_attn_implementation_fails_at_load_time(saved, impl):
    with pytest.raises(ValueError, match=ATTN_MESSAGE + f".*got '{impl}'"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(saved, attn_implementation=impl)


def test_unsupported_attn_implementation_fails_at_construction_and_set_time():
    config = tiny_config()
    config._attn_implementation = "paged|eager"
    with pytest.raises(ValueError, match=ATTN_MESSAGE):
        DiffusionGemmaForBlockDiffusion(config)
    model = tiny_model(tiny_config())
    with pytest.raises(ValueError, match=ATTN_MESSAGE):
        model.set_attn_implementation("paged|eager")
    assert model.attention_backend == "sdpa"  # unchanged by the refused request


def test_config_edited_after_loading_fails_at_forward(model):
    model.config._attn_implementation = "flash_attention_2"  # bypasses transformers' checks
    try:
        with pytest.raises(ValueError, match=ATTN_MESSAGE):
            model(input_ids=IDS, decoder_input_ids=CANVAS)
    finally:
        model.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
def test_supported_attn_implementations_load(saved, impl):
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(saved, attn_implementation=impl)
    assert model.attention_backend == attention_backend_for(impl)


def test_experts_implementation_is_refused(saved):
    check_experts_implementation(None)
    check_experts_implementation("eager")  # what transformers records on the config when nothing was asked
    # "batched_mm" used to load and be ignored: our experts always run modeling/moe.py
    with pytest.raises(ValueError, match="`experts_implementation` cannot be chosen.*got 'batched_mm'"):
        DiffusionGemmaForBlockDiffusion.from_pretrained(saved, experts_implementation="batched_mm")
