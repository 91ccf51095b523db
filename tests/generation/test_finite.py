"""generation/finite.py: NaN/Inf logits raise `NonFiniteLogitsError` naming the step, the canvas and the cause, in
reference, lock-step fast and mixed batching; processors returning None or the wrong shape get a clear error."""

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.generation.finite import (
    EMPTY, FINE, MODEL, PROCESSORS, NonFiniteLogitsError, fault_codes, model_logits_bad, processed_scores_bad,
    raise_for_faults,
)

pytestmark = pytest.mark.usefixtures("one_thread")
IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
MODES = [dict(sampling="reference"), dict(sampling="fast", batching="lockstep", seed=0),
         dict(sampling="fast", batching="mixed", seed=0)]
KW = dict(max_new_tokens=32, max_denoising_steps=3)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def poisoned(model, value):
    m = tiny_model()
    with torch.no_grad():
        m.model.decoder.layers[2].mlp.down_proj.weight[0, 0] = value
    return m


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("mode", MODES, ids=["reference", "lockstep", "mixed"])
def test_bad_weight_names_the_model(model, mode, value):
    with pytest.raises(NonFiniteLogitsError, match=r"step 1 of canvas 0.*model's logits hold NaN or Inf") as err:
        poisoned(model, value).generate(IDS, **mode, **KW)
    assert err.value.cause == "model" and err.value.step == 1 and err.value.canvas == 0


class Poison:
    """A processor that writes `value` into row `row` from step `at` (1-based) on."""

    def __init__(self, value, row=0, at=1, steps=3):
        self.value, self.row, self.at, self.steps = value, row, at, steps

    def __call__(self, input_ids, scores, cur_step=None):
        if self.steps - int(cur_step) + 1 >= self.at and scores.shape[0] > self.row:
            scores = scores.clone()
            scores[self.row, 0, 0] = self.value
        return scores


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("mode", MODES, ids=["reference", "lockstep", "mixed"])
def test_processor_nan_names_the_processors(model, mode, value):
    with pytest.raises(NonFiniteLogitsError, match=r"step 2 of canvas 0.*`logits_processor`s produced NaN"):
        model.generate(IDS[:1], logits_processor=[Poison(value, at=2)], **mode, **KW)


@pytest.mark.parametrize("mode", MODES, ids=["reference", "lockstep", "mixed"])
def test_processor_banning_everything_is_empty(model, mode):
    ban = lambda ids, scores, cur_step=None: torch.full_like(scores, float("-inf"))  # noqa: E731
    with pytest.raises(NonFiniteLogitsError, match=r"step 1 of canvas 0.*nothing to sample") as err:
        model.generate(IDS, logits_processor=[ban], **mode, **KW)
    assert err.value.cause == "empty"


def test_second_canvas_is_named(model):
    class Late:
        calls = 0

        def __call__(self, ids, scores, cur_step=None):
            Late.calls += 1
            return scores if ids.shape[1] <= 4 else scores.fill_(float("nan"))
    with pytest.raises(NonFiniteLogitsError, match=r"step 1 of canvas 1"):
        model.generate(IDS[:1], logits_processor=[Late()], sampling="fast", seed=0, eos_token_id=None, **KW)


@pytest.mark.parametrize("mode", MODES, ids=["reference", "lockstep", "mixed"])
@pytest.mark.parametrize("returns, error, message", [
    (lambda s: None, TypeError, "returned NoneType instead of the scores"),
    (lambda s: s[..., :-1], ValueError, r"returned scores of shape \[.*\], expected"),
    (lambda s: s[0], ValueError, "returned scores of shape"),
    (lambda s: s.argmax(-1, keepdim=True).expand_as(s), ValueError, "dtype torch.int64"),
])
def test_processor_bad_return(model, mode, returns, error, message):
    with pytest.raises(error, match=message):
        model.generate(IDS, logits_processor=[lambda ids, scores, cur_step=None: returns(scores)], **mode, **KW)


def test_pure_functions_on_hand_built_logits():
    logits = torch.zeros(3, 2, 4)
    logits[1, 1, 2] = float("nan")
    logits[2, 0, 0] = float("-inf")  # -inf from the model: not finite
    assert model_logits_bad(logits).tolist() == [False, True, True]
    bad, empty = processed_scores_bad(logits, logits.shape)
    assert bad.tolist() == [False, True, False] and empty.tolist() == [False, False, False]
    logits[0, 1] = float("-inf")
    assert processed_scores_bad(logits, logits.shape)[1].tolist() == [True, False, False]
    codes = fault_codes(torch.tensor([False, True, False]), torch.tensor([True, True, False]),
                        torch.tensor([False, False, True]))
    assert codes.tolist() == [PROCESSORS, MODEL, EMPTY]
    raise_for_faults([FINE, FINE], 3, 0)  # nothing to report
    with pytest.raises(NonFiniteLogitsError, match=r"step 4 of canvas 2, batch rows \[7\]: the model"):
        raise_for_faults([FINE, MODEL], 4, 2, rows=[3, 7])


@pytest.mark.parametrize("mode", MODES, ids=["reference", "lockstep", "mixed"])
def test_nan_fp8_weight_scale_names_the_model(tmp_path_factory, mode):
    """The issue's case: one NaN in an FP8 `weight_scale` of a quantized checkpoint."""
    from safetensors.torch import load_file, save_file

    from diffusiongemma import DiffusionGemmaForBlockDiffusion
    from diffusiongemma.quantization.quantize import quantize_checkpoint

    root = tmp_path_factory.mktemp("fp8nan")
    tiny_model(seed=6).save_pretrained(root / "dense")
    quantize_checkpoint(str(root / "dense"), str(root / "fp8"), "fp8-dynamic")
    tensors = load_file(root / "fp8" / "model.safetensors")
    key = next(k for k in tensors if k.endswith("self_attn.o_proj.weight_scale"))
    tensors[key][0] = float("nan")
    save_file(tensors, str(root / "fp8" / "model.safetensors"), metadata={"format": "pt"})
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(root / "fp8")
    with pytest.raises(NonFiniteLogitsError, match="step 1 of canvas 0.*model's logits hold NaN or Inf"):
        model.generate(IDS, **mode, **KW)
