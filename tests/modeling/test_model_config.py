"""diffusiongemma/modeling/config.py (named apart from tests/generation/test_config.py: pytest needs unique basenames)."""

import pytest

from conftest import tiny_config
from diffusiongemma.modeling.config import encoder_is_causal, layer_shape


def test_layer_shape_reads_the_heterogeneous_full_layers():
    text = tiny_config().text_config
    sliding, full = layer_shape(text, 0), layer_shape(text, 5)
    assert (sliding.head_dim, sliding.num_kv_heads, sliding.sliding_window, sliding.is_sliding) == (16, 2, 8, True)
    assert (full.head_dim, full.num_kv_heads, full.sliding_window, full.is_sliding) == (32, 1, None, False)
    assert full.rope["rope_type"] == "proportional"


def test_unknown_layer_type_is_a_clear_error():
    # transformers accepts any string here; it used to surface as a bare KeyError from rope_parameters
    text = tiny_config(layer_types=["sliding_attention"] * 4 + ["chunked_attention", "full_attention"]).text_config
    with pytest.raises(ValueError, match=r"`layer_types\[4\]` must be 'full_attention' or 'sliding_attention'.*"
                                         r"got 'chunked_attention'"):
        layer_shape(text, 4)


def test_only_bidirectional_all_makes_the_encoder_non_causal():
    assert encoder_is_causal(tiny_config().text_config)
    assert encoder_is_causal(tiny_config(use_bidirectional_attention="vision").text_config)
    assert not encoder_is_causal(tiny_config(use_bidirectional_attention="all").text_config)
