"""The Viterbi pass against brute force over every sequence, its tie and -inf handling, and the end states."""

import itertools

import torch

from conftest import tiny_tokenizer

from diffusiongemma import Regex
from diffusiongemma.constraints import compile_constraint
from diffusiongemma.constraints.viterbi import allowed_mask, class_argmax, class_maxima, constrained_path

TOK = tiny_tokenizer()
A, B = TOK.convert_tokens_to_ids(["a", "b"])
EOS, PAD = 1, 0


def brute_force(logits, automaton, start, L):
    best = None
    for seq in itertools.product([A, B, EOS, PAD], repeat=L):
        state = automaton.walk(torch.tensor([start]), torch.tensor([seq]))
        if automaton.complete(state):
            score = sum(float(logits[i, t]) for i, t in enumerate(seq))
            if best is None or score > best[0]:
                best = (score, seq)
    return best


def test_matches_brute_force_on_random_scores():
    a = compile_constraint(Regex(r"(ab|b)a*"), TOK, 128, [EOS], PAD)
    g = torch.Generator().manual_seed(0)
    L = 4
    for _ in range(25):
        logits = torch.full((2, L, 128), -50.0)
        for tok in (A, B, EOS, PAD):
            logits[:, :, tok] = torch.randn(2, L, generator=g)
        start = torch.tensor([a.initial, a.initial])
        tokens, states, reached = constrained_path(logits, a, start, a.accepting.expand(2, -1))
        assert bool(reached.all())
        for row in range(2):
            assert tuple(tokens[row].tolist()) == brute_force(logits[row], a, a.initial, L)[1]
            # the states are those before each position on the path
            walked = [a.initial]
            for t in tokens[row].tolist()[:-1]:
                walked.append(int(a.walk(torch.tensor([walked[-1]]), torch.tensor([[t]]))[0]))
            assert states[row].tolist() == walked


def test_class_maxima_picks_the_best_token_of_each_class():
    a = compile_constraint(Regex(r"[ab]c"), TOK, 128, [EOS], PAD)
    logits = torch.zeros(1, 1, 128)
    logits[0, 0, A], logits[0, 0, B] = 2.0, 3.0
    best = class_maxima(logits, a)
    klass = int(a.token_class[A])
    assert a.token_class[B] == klass  # a and b behave alike everywhere
    assert float(best[0, 0, klass]) == 3.0
    assert int(class_argmax(logits, a, torch.tensor([[klass]]))[0, 0]) == B
    logits[0, 0, A] = 3.0  # a tie: the lower id
    assert int(class_argmax(logits, a, torch.tensor([[klass]]))[0, 0]) == min(A, B)
    # all -inf: a finite stand-in score, and still a token of the class
    empty = torch.full((1, 1, 128), float("-inf"))
    assert bool(class_maxima(empty, a).isfinite().all())
    assert int(a.token_class[class_argmax(empty, a, torch.tensor([[klass]]))[0, 0]]) == klass


def test_forced_through_masked_tokens_and_unreachable_end():
    a = compile_constraint(Regex(r"abab"), TOK, 128, [EOS], PAD)
    logits = torch.zeros(1, 3, 128)
    logits[..., [A, B]] = float("-inf")  # a processor forbade the only letters: the path still follows the regex
    tokens, _, reached = constrained_path(logits, a, torch.tensor([a.initial]), a.accepting[None])
    assert tokens[0].tolist() == [A, B, A]
    assert not bool(reached[0])  # 3 tokens cannot finish "abab": it ends in the best state it can reach


def test_end_ok_limits_where_a_canvas_ends():
    a = compile_constraint(Regex(r"a+"), TOK, 128, [EOS], PAD)
    logits = torch.zeros(1, 3, 128)
    logits[..., PAD] = 5.0  # pad is most likely everywhere
    tokens, _, _ = constrained_path(logits, a, torch.tensor([a.initial]), a.accepting[None])
    assert tokens[0].tolist() == [A, PAD, PAD]  # one letter, then the answer ends


def test_allowed_mask_follows_the_states():
    a = compile_constraint(Regex(r"ab"), TOK, 128, [EOS], PAD)
    after_a = int(a.walk(torch.tensor([a.initial]), torch.tensor([[A]]))[0])
    mask = allowed_mask(a, torch.tensor([[a.initial, after_a]]))  # [1, 2, V]
    assert mask[0, 0].nonzero()[:, 0].tolist() == [A] and mask[0, 1].nonzero()[:, 0].tolist() == [B]
