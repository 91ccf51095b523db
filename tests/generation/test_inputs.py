"""generation/resolve.py (with modeling/validation.py): every `generate` input of the kinds that used to run on
silently or fail deep in torch is refused up front, naming the argument and the cause."""

import pytest
import torch

from conftest import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
LEFT = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
MODES = {
    "reference": dict(sampling="reference"),
    "lockstep": dict(sampling="fast", batching="lockstep", seed=0),
    "mixed": dict(sampling="fast", batching="mixed", seed=0),
}
KW = dict(max_new_tokens=16, max_denoising_steps=2)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mask, message", [
    ([[0, 0, 0, 0], [1, 1, 1, 1]], r"marks every token of batch rows \[0\] as padding"),
    ([[0, 0, 0, 0], [0, 0, 0, 0]], r"batch rows \[0, 1\] as padding"),
    ([[1, 1, 0, 0], [1, 1, 1, 1]], r"batch rows \[0\] is not left padding"),
    ([[1, 1, 1, 1], [1, 1, 1, 0]], r"batch rows \[1\] is not left padding"),
    ([[0, 1, 0, 1], [1, 1, 1, 1]], r"batch rows \[0\] is not left padding"),
    ([[1, 0, 1, 1], [1, 0, 0, 1]], r"batch rows \[0, 1\] is not left padding"),
    ([[0, 0, 1, 2], [1, 1, 1, 1]], "must contain only 0 and 1"),
])
def test_bad_attention_mask(model, mode, mask, message):
    with pytest.raises(ValueError, match=message):
        model.generate(IDS, attention_mask=torch.tensor(mask), **MODES[mode], **KW)


@pytest.mark.parametrize("mode", MODES)
def test_left_padding_and_bool_masks_still_run(model, mode):
    for mask in (LEFT, LEFT.bool()):
        out = model.generate(IDS, attention_mask=mask, **MODES[mode], **KW)
        assert out.sequences.shape == (2, 4 + 16)


@pytest.mark.parametrize("field, value, message", [
    ("pad_token_id", 128, r"`pad_token_id` \(128\) is outside the vocabulary \[0, 128\)"),
    ("pad_token_id", 10**6, r"`pad_token_id` \(1000000\) is outside the vocabulary"),
    ("eos_token_id", 200, r"`eos_token_id` 200 holds 200, outside the vocabulary"),
    ("eos_token_id", [1, 128], r"`eos_token_id` \[1, 128\] holds 128"),
    ("pad_token_id", -1, "`pad_token_id` must be a non-negative integer"),
])
def test_special_ids_outside_vocabulary(model, field, value, message):
    with pytest.raises(ValueError, match=message):
        model.generate(IDS[1:], **{field: value}, **KW)


@pytest.mark.parametrize("seed, error, message", [
    ("5", TypeError, r"`seed` must be an int or a list of ints, got '5' \(str\)"),
    (1.7, TypeError, r"got 1.7 \(float\)"),
    (2.0, TypeError, r"got 2.0 \(float\)"),
    (True, TypeError, r"got True \(bool\)"),
    ([1, "2"], TypeError, r"got '2' \(str\)"),
    (torch.tensor(3), TypeError, r"\(Tensor\)"),
    (2**70, ValueError, r"`seed` must lie in \[0, 2\*\*32 - 1\]"),
    (2**63, ValueError, "the CPU generator keeps 32 bits"),  # would repeat seed 0
    (2**32 + 5, ValueError, "must lie in"),  # would repeat seed 5
    (2**32 - 1, ValueError, r"every row: an int seed gives row b seed \+ b"),  # row 1 would get 2**32
    (-1, ValueError, "must lie in"),
    ([0, 2**32], ValueError, "must lie in"),
])
def test_bad_seed(model, seed, error, message):
    with pytest.raises(error, match=message):
        model.generate(IDS, sampling="fast", seed=seed, **KW)


def test_extreme_valid_seeds_run(model):
    out = model.generate(IDS, sampling="fast", seed=[2**32 - 1, 0], **KW)
    again = model.generate(IDS, sampling="fast", seed=[2**32 - 1, 0], **KW)
    assert torch.equal(out.sequences, again.sequences)


@pytest.mark.parametrize("ids, message", [
    (torch.zeros(0, 4, dtype=torch.long), r"`input_ids` must contain at least one row, got shape \(0, 4\)"),
    (torch.zeros(2, 0, dtype=torch.long), "`input_ids` must contain at least one token"),
    (IDS.to(torch.uint8), "`input_ids` must hold integer token ids of dtype torch.long .* got dtype torch.uint8"),
    (IDS.to(torch.int16), "got dtype torch.int16"),
    (IDS.to(torch.int8), "got dtype torch.int8"),
    (IDS.float(), "got dtype torch.float32"),
    (IDS.bool(), "got dtype torch.bool"),
    (IDS[0], r"`input_ids` must have shape \[batch, length\]"),
    ([[1, 2]], "`input_ids` must be a torch.Tensor"),
])
@pytest.mark.parametrize("mode", ["reference", "lockstep"])
def test_bad_input_ids(model, ids, message, mode):
    with pytest.raises((ValueError, TypeError), match=message):
        model.generate(ids, **MODES[mode], **KW)


def test_int32_ids_run(model):
    out = model.generate(IDS.int(), sampling="fast", seed=0, **KW)
    assert out.sequences.shape == (2, 20)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_self_conditioning_logits(model, value):
    logits = torch.zeros(1, 16, 128)
    logits[0, 3, 7] = value
    with pytest.raises(ValueError, match="`self_conditioning_logits` must be finite floats .* non-finite entries"):
        model.generate(IDS[1:], self_conditioning_logits=logits, **KW)
    with pytest.raises(ValueError, match="got dtype torch.int64"):
        model.generate(IDS[1:], self_conditioning_logits=torch.zeros(1, 16, 128, dtype=torch.long), **KW)
