"""ConstraintGuide: a row's state carried across canvases from what it committed, the budget (past it only pad),
the optional projection of the logits, and the end-of-answer check."""

import functools
import re
from unittest import mock

import pytest
import torch

from conftest import tiny_model, tiny_tokenizer

from diffusiongemma import Regex
from diffusiongemma.constraints import compile_constraint
from diffusiongemma.constraints.guide import ConstraintGuide

TOK = tiny_tokenizer()
EOS, PAD = 1, 0


def ids(text):
    return TOK.convert_tokens_to_ids(list(text))


def test_state_carries_across_canvases_and_rows():
    a = compile_constraint(Regex(r"ab*c"), TOK, 128, [EOS], PAD)
    guide = ConstraintGuide(a, canvas_length=2, max_new_tokens=6)
    prompt = torch.tensor(ids("zz"))
    first = guide.start_states([prompt], [7], [2], "cpu")
    assert first.tolist() == [a.initial]
    # row 7 committed "ab"; row 9 is new: each gets its own state
    committed = torch.cat([prompt, torch.tensor(ids("ab"))])
    states = guide.start_states([committed, prompt], [7, 9], [4, 2], "cpu")
    expected = a.walk(torch.tensor([a.initial]), torch.tensor([ids("ab")]))
    assert states.tolist() == [int(expected[0]), a.initial]
    assert guide.tokens_left([7, 9], [4, 2]) == [4, 6]
    guide.forget(7)
    assert 7 not in guide.rows


def test_past_the_budget_only_pad():
    a = compile_constraint(Regex(r"[a-z]+"), TOK, 128, [EOS], PAD)
    guide = ConstraintGuide(a, canvas_length=4, max_new_tokens=2)
    logits = torch.zeros(1, 4, 128)
    logits[..., ids("q")[0]] = 5.0  # the model wants q everywhere
    _, path = guide.project(logits, [torch.tensor(ids("zz"))], [0], [2])
    assert path[0].tolist() == ids("qq") + [PAD, PAD]


@pytest.mark.parametrize("project_canvas", [False, True])
def test_projection_of_the_logits(project_canvas):
    a = compile_constraint(Regex(r"ab"), TOK, 128, [EOS], PAD)
    guide = ConstraintGuide(a, canvas_length=3, max_new_tokens=3, project_canvas=project_canvas)
    logits = torch.randn(1, 3, 128, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    out, path = guide.project(logits, [torch.tensor(ids("z"))], [0], [1])
    assert path[0, :2].tolist() == ids("ab") and int(path[0, 2]) in (EOS, PAD)
    if project_canvas:  # each position keeps only the tokens allowed there on the best path
        assert out[0, 0].isfinite().nonzero()[:, 0].tolist() == ids("a")
        assert out[0, 1].isfinite().nonzero()[:, 0].tolist() == ids("b")
        assert sorted(out[0, 2].isfinite().nonzero()[:, 0].tolist()) == [PAD, EOS]
    else:
        assert torch.equal(out, before)


@pytest.mark.usefixtures("one_thread")
def test_generate_with_the_logits_projected_too():
    model = tiny_model()
    guide = functools.partial(ConstraintGuide, project_canvas=True)
    ids_ = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    with mock.patch("diffusiongemma.generation.plan.ConstraintGuide", guide):
        for mode in (dict(sampling="reference"), dict(sampling="fast", seed=0)):
            out = model.generate(ids_, constraint=Regex(r"[0-9]{2}(,[0-9]{2})+"), tokenizer=TOK, max_new_tokens=32,
                                 max_denoising_steps=4, eos_token_id=EOS, pad_token_id=PAD, **mode)
            for row in out.sequences[:, 5:]:
                assert re.fullmatch(r"[0-9]{2}(,[0-9]{2})+", TOK.decode(row, skip_special_tokens=True))


def test_a_banned_token_is_never_brought_back():
    # the processors banned every digit; the constraint needs digits: the path stops (pad) where it would need one
    from diffusiongemma.constraints.guide import cut_at_bans

    a = compile_constraint(Regex(r"x[0-9]{2}"), TOK, 128, [EOS], PAD)
    guide = ConstraintGuide(a, canvas_length=4, max_new_tokens=4)
    logits = torch.zeros(1, 4, 128)
    logits[..., ids("0123456789")] = float("-inf")
    out, path = guide.project(logits.clone(), [torch.tensor(ids("zz"))], [0], [2])
    assert path[0].tolist() == ids("x") + [PAD] * 3
    # unit: only positions within the budget count, and pad itself never does
    path = torch.tensor([[5, 6, 7, 8]])
    scores = torch.zeros(1, 4, 128)
    scores[0, 3, 8] = float("-inf")
    assert cut_at_bans(scores, path, [3], PAD).tolist() == [[5, 6, 7, 8]]  # position 3 is past the budget
    scores[0, 1, 6] = float("nan")
    assert cut_at_bans(scores, path, [4], PAD).tolist() == [[5, PAD, PAD, PAD]]
