"""training/loss.py `check_loss_inputs`: the block-diffusion loss refuses an all-padding or non-left-padded prefix,
labels outside the vocabulary and mis-shaped labels, naming the argument (no IndexError from cross_entropy)."""

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.training.loss import block_diffusion_loss

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[0, 5, 6], [7, 8, 9]])
LABELS = torch.randint(3, 128, (2, 16))


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("mask, message", [
    ([[0, 0, 0], [1, 1, 1]], r"marks every token of batch rows \[0\] as padding"),
    ([[0, 0, 0], [0, 0, 0]], r"batch rows \[0, 1\] as padding"),
    ([[1, 1, 0], [1, 1, 1]], r"batch rows \[0\] is not left padding"),
    ([[1, 0, 1], [1, 1, 1]], "is not left padding"),
    ([[1, 1], [1, 1]], r"`attention_mask` must have shape \[2, 3\]"),
])
def test_bad_mask(model, mask, message):
    with pytest.raises(ValueError, match=message):
        block_diffusion_loss(model, IDS, LABELS, attention_mask=torch.tensor(mask))


@pytest.mark.parametrize("labels, message", [
    (LABELS.clone().fill_(128), r"`labels` hold ids outside the vocabulary \[0, 128\).*max 128"),
    (torch.full((2, 16), -5), r"outside the vocabulary.*min -5"),
    (torch.cat([LABELS[:, :8], torch.full((2, 8), 1000)], 1), "max 1000"),
    (LABELS[:1], r"`labels` must have shape \[2, canvas length\], got \[1, 16\]"),
    (LABELS.float(), r"`labels` must be a \[batch, canvas\] tensor of token ids"),
    (LABELS[0], r"`labels` must be a \[batch, canvas\] tensor"),
])
def test_bad_labels(model, labels, message):
    with pytest.raises(ValueError, match=message):
        block_diffusion_loss(model, IDS, labels)


def test_bad_input_ids(model):
    with pytest.raises(ValueError, match="`input_ids` holds token ids outside the vocabulary"):
        block_diffusion_loss(model, IDS + 200, LABELS)


def test_ignored_labels_and_left_padding_still_train(model):
    labels = LABELS.clone()
    labels[:, 8:] = -100
    out = block_diffusion_loss(model, IDS, labels, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
                               generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out.loss)
