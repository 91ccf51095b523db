"""Constrained denoising: every answer matches a regular expression or validates against a JSON schema.

`Regex` / `JsonSchema` (spec.py) name the constraint; `compile_constraint` (automaton.py) turns it into a token
automaton over the tokenizer; `constrained_path` (viterbi.py) picks a canvas' most probable accepted tokens;
`ToolCalls` (tools.py) constrains an answer to function calls in Gemma 4's syntax (tool_syntax.py) and
`parse_tool_calls` (tool_parse.py) reads them back; `ConstraintGuide` (guide.py) carries each row's automaton state
across canvases inside `generate`; answer_check.py checks every answer as text before it is called complete. See
docs/constraints.md.
"""

from .automaton import TokenAutomaton, compile_constraint
from .budget import CompileBudget
from .errors import ConstraintError
from .spec import JsonSchema, Regex, as_constraint
from .tool_parse import ParsedReply, parse_tool_calls
from .tools import ToolCalls, ToolsError

__all__ = ["CompileBudget", "ConstraintError", "JsonSchema", "ParsedReply", "Regex", "TokenAutomaton", "ToolCalls",
           "ToolsError", "as_constraint", "compile_constraint", "parse_tool_calls"]
