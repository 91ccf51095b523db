"""Compilation to the token automaton: the dense table it factorizes, DONE after EOS/pad, rows beyond the
tokenizer, the cache, and the errors (malformed, unspellable, unsatisfiable, no tokenizer)."""

import pytest
import torch

from conftest import tiny_tokenizer

from diffusiongemma import ConstraintError, JsonSchema, Regex
from diffusiongemma.constraints import compile_constraint
from diffusiongemma.constraints.automaton import _CACHE

TOK = tiny_tokenizer()
EOS, PAD = 1, 0


def ids(text: str) -> list[int]:
    return TOK.convert_tokens_to_ids(list(text))


def test_table_follows_the_regex():
    a = compile_constraint(Regex(r"[0-9]{2}x"), TOK, 128, [EOS], PAD)
    table = a.table  # [S, V]
    assert table.shape == (a.num_states, 128)
    assert torch.equal(table, a.class_table[:, a.token_class])
    digits = set(ids("0123456789"))
    assert set((table[a.initial] >= 0).nonzero()[:, 0].tolist()) == digits  # only digits first
    state = a.walk(torch.tensor([a.initial]), torch.tensor([ids("42x")]))
    assert bool(a.complete(state)) and not bool(a.complete(a.walk(torch.tensor([a.initial]),
                                                                   torch.tensor([ids("42")]))))
    assert int(a.walk(torch.tensor([a.initial]), torch.tensor([ids("4x")]))[0]) == -1  # not allowed
    assert a.distance[a.initial] == 3


def test_eos_and_pad_only_where_accepting_then_only_pad():
    a = compile_constraint(Regex(r"ab"), TOK, 128, [EOS], PAD)
    table = a.table
    after_a = a.walk(torch.tensor([a.initial]), torch.tensor([ids("a")]))[0]
    after_ab = a.walk(torch.tensor([a.initial]), torch.tensor([ids("ab")]))[0]
    assert table[a.initial, EOS] == -1 and table[after_a, EOS] == -1 and table[after_a, PAD] == -1
    assert table[after_ab, EOS] == a.done and table[after_ab, PAD] == a.done
    assert set((table[a.done] >= 0).nonzero()[:, 0].tolist()) == {PAD}
    assert bool(a.accepting[a.done])
    # special tokens (bos, unk) are never allowed anywhere
    assert bool((table[:, [2, 3]] == -1).all())


def test_rows_beyond_the_tokenizer_are_never_allowed():
    a = compile_constraint(Regex(r"[a-z<>0-9x]+"), TOK, 160, [EOS], PAD)  # model vocab 160, tokenizer 128
    assert a.table.shape[1] == 160
    assert bool((a.table[:, 128:] == -1).all())
    assert bool((a.table[:, 100] >= 0).any())  # "<x100>" spells text the regex allows
    small = compile_constraint(Regex(r"[0-9]+"), TOK, 64, [EOS], PAD)  # tokenizer ids beyond the model: dropped
    assert small.table.shape[1] == 64


def test_compiled_once_per_constraint_and_tokenizer():
    a = compile_constraint(JsonSchema({"type": "boolean"}), TOK, 128, [EOS], PAD)
    assert compile_constraint(JsonSchema('{"type": "boolean"}'), TOK, 128, [EOS], PAD) is a
    assert compile_constraint(JsonSchema({"type": "boolean"}), tiny_tokenizer(), 128, [EOS], PAD) is a  # same vocab
    assert compile_constraint(JsonSchema({"type": "boolean"}), TOK, 128, [EOS, 2], PAD) is not a
    assert len(_CACHE) <= 32


def test_json_schema_factorizes_into_few_classes():
    a = compile_constraint(JsonSchema({"type": "object", "properties": {"n": {"type": "string"}},
                                       "required": ["n"]}), TOK, 128, [EOS], PAD)
    assert a.num_classes < 40 < 128
    assert a.src.shape == a.cls.shape == a.dst.shape


@pytest.mark.parametrize("constraint, message", [
    (Regex("(ab"), r"Regex\('\(ab'\): malformed or unsupported regular expression"),
    (Regex(r"(?=a)a"), "malformed or unsupported"),  # look-around
    (Regex("é+"), "the tokenizer cannot spell it"),
    (Regex(r"a[^\s\S]"), "no answer can satisfy it"),
])
def test_errors_name_the_constraint(constraint, message):
    with pytest.raises(ConstraintError, match=message):
        compile_constraint(constraint, TOK, 128, [EOS], PAD)


def test_a_tokenizer_is_required():
    with pytest.raises(ConstraintError, match="needs the model's tokenizer: pass `tokenizer=`"):
        compile_constraint(Regex("a"), None, 128, [EOS], PAD)
