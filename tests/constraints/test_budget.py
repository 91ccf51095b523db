"""Compiling within a budget: a forked child, killed when its time is up, its address space capped; the refusal names
the constraint and the budget, and is cached so a retry costs nothing. Small budgets only: no test lets a compile
take more than a fraction of a second or ~100 MiB."""

import os
import time

import pytest

from conftest import tiny_tokenizer

from diffusiongemma import ConstraintError, JsonSchema, Regex
from diffusiongemma.constraints import compile_constraint
from diffusiongemma.constraints.budget import CompileBudget, run_within_budget

TOK = tiny_tokenizer()
MIB = 1 << 20
SLOW = JsonSchema({"type": "string", "maxLength": 40})  # top level: outlines-core's automaton explodes


def test_a_result_and_an_error_come_back_from_the_child():
    assert run_within_budget(lambda: {"pid": os.getpid()}, CompileBudget(10, 64 * MIB), "x")["pid"] != os.getpid()

    def fails():
        raise ConstraintError("named cause")

    with pytest.raises(ConstraintError, match="named cause"):
        run_within_budget(fails, CompileBudget(10, 64 * MIB), "x")


def test_time_is_bounded():
    start = time.monotonic()
    with pytest.raises(ConstraintError, match=r"exceeds the budget of 0.3 s .*still running after 0.3 s"):
        run_within_budget(lambda: time.sleep(30), CompileBudget(0.3, 64 * MIB), "Sleep")
    assert time.monotonic() - start < 5


def test_memory_is_bounded():
    with pytest.raises(ConstraintError, match="exceeds the budget of 10 s and 0.0625 GiB.*out of memory"):
        run_within_budget(lambda: bytearray(512 * MIB), CompileBudget(10, 64 * MIB), "Big")


def test_a_schema_over_budget_is_refused_and_the_refusal_cached():
    budget = CompileBudget(0.5, 128 * MIB)
    start = time.monotonic()
    with pytest.raises(ConstraintError, match=r'JsonSchema\({"type": "string", "maxLength": 40}\): compiling it '
                                              r"exceeds the budget of 0.5 s"):
        compile_constraint(SLOW, TOK, 128, [1], 0, budget=budget)
    assert time.monotonic() - start < 10
    again = time.monotonic()
    with pytest.raises(ConstraintError, match="exceeds the budget"):
        compile_constraint(SLOW, TOK, 128, [1], 0, budget=budget)
    assert time.monotonic() - again < 0.1  # from the cache of refusals


def test_within_budget_it_compiles_and_is_cached():
    budget = CompileBudget(30, 512 * MIB)
    a = compile_constraint(Regex("[a-c]{2}x"), TOK, 128, [1], 0, budget=budget)
    assert compile_constraint(Regex("[a-c]{2}x"), TOK, 128, [1], 0, budget=budget) is a


def test_the_dense_table_is_bounded_too():
    # outlines-core's index over the tokenizer's 128 tokens is small, but the [S, V] table over a model with 2**22
    # vocabulary rows would not fit the budget
    with pytest.raises(ConstraintError, match=r"its automaton \(51 states x 4194304 tokens\) needs about 2.4"):
        compile_constraint(Regex("[a-z]{50}"), TOK, 1 << 22, [1], 0, budget=CompileBudget(30, 256 * MIB))


@pytest.mark.parametrize("seconds, memory", [(0, 1), (-1, 1), (1, 0), (1, 1.5)])
def test_bad_budgets(seconds, memory):
    with pytest.raises(ValueError, match="CompileBudget"):
        CompileBudget(seconds, memory)
