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
