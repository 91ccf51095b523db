"""Constrained denoising: every answer matches a regular expression or validates against a JSON schema.

`Regex` / `JsonSchema` (spec.py) name the constraint; `compile_constraint` (automaton.py) turns it into a token
automaton over the tokenizer; `constrained_path` (viterbi.py) picks a canvas' most probable accepted tokens;
`ConstraintGuide` (guide.py) carries each row's automaton state across canvases inside `generate`; answer_check.py
checks every answer as text before it is called complete. See docs/constraints.md.
"""

from .automaton import TokenAutomaton, compile_constraint
from .budget import CompileBudget
from .errors import ConstraintError
from .spec import JsonSchema, Regex, as_constraint

__all__ = ["CompileBudget", "ConstraintError", "JsonSchema", "Regex", "TokenAutomaton", "as_constraint", "compile_constraint"]
