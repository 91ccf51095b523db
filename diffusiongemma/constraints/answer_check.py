"""The last check of a constrained answer, on the text its user receives, before it is called complete.

The automaton guarantees the tokens; the user gets `tokenizer.decode(tokens)`. So every answer is checked once more,
as text: `decode` must give exactly the text the tokens spell (what the automaton read), a `JsonSchema` answer
must parse as JSON and validate against the schema with `jsonschema` (formats included), and a `ToolCalls` answer
must parse into the calls its mode promises, each call's arguments valid (`parse_tool_calls`). A failure is a bug of
ours (outlines-core or this package expressing the schema wrongly): `generate` reports it in
`out.constraint_errors` and flags the row `truncated`, the server ends the response with an error naming it.
"""

import functools
import json

from .automaton import TokenAutomaton
from .spec import JsonSchema
from .tool_parse import tool_calls_problem
from .tools import ToolCalls

BUG = "(a bug of diffusiongemma's constrained decoding: please report it with the constraint)"


def answer_ids(tokens: list[int], end_ids) -> list[int]:
    """The answer's tokens: everything before the first EOS or pad."""
    ends = set(end_ids)
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[:i]
    return tokens


@functools.lru_cache(maxsize=32)
def schema_validator(text: str):
    """A jsonschema validator (the draft the schema names, formats checked) for the schema's JSON text."""
    from jsonschema.validators import validator_for

    schema = json.loads(text)
    cls = validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_problem(text: str, constraint: JsonSchema) -> str | None:
    """Why `text` is not a JSON value valid under the schema, or None."""
    from jsonschema.exceptions import best_match

    try:
        value = json.loads(text)
    except ValueError as error:
        return f"the answer {text[:80]!r} is not JSON ({error})"
    error = best_match(schema_validator(constraint.text).iter_errors(value))
    if error is None:
        return None
    place = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"the answer fails the schema at answer{place}: {error.message}"


def spelled_text(automaton: TokenAutomaton, ids: list[int]) -> str:
    """The text the automaton read for `ids`: their bytes joined (an unfinished character as U+FFFD)."""
    return b"".join(automaton.spelled[t] or b"" for t in ids).decode("utf-8", errors="replace")


def answer_problem(automaton: TokenAutomaton, tokenizer, tokens: list[int], complete: bool) -> str | None:
    """Why an answer the automaton accepted is not valid as text, or None.

    Args:
        automaton: the compiled constraint.
        tokenizer: the tokenizer the user decodes with.
        tokens: the generated ids (EOS and pad may follow the answer).
        complete: the automaton accepted the whole answer (a truncated one is only checked for its decoding).
    """
    ids = answer_ids(tokens, automaton.end_ids)
    text = tokenizer.decode(ids)  # an answer holds no special token but those its constraint spells (ToolCalls)
    spelled = spelled_text(automaton, ids)
    if text != spelled:
        return (f"{automaton.description}: decode() gives {text[:80]!r} where the tokens spell {spelled[:80]!r}, so "
                f"the text does not match the constraint {BUG}")
    if complete and isinstance(automaton.constraint, JsonSchema):
        problem = schema_problem(text, automaton.constraint)
        if problem is not None:
            return f"{automaton.description}: {problem} {BUG}"
    if complete and isinstance(automaton.constraint, ToolCalls):
        problem = tool_calls_problem(text, automaton.constraint)  # each call parses and its arguments validate
        if problem is not None:
            return f"{automaton.description}: {problem} {BUG}"
    return None


def ended_early(automaton: TokenAutomaton) -> str:
    """Why an answer that reached EOS or padding is not complete."""
    return (f"the {automaton.description} answer ended before it was complete: the `logits_processor`s banned every "
            f"token the constraint allowed next (or a stopping criterion ended it)")


def check_answers(automaton: TokenAutomaton, tokenizer, answers, complete) -> tuple[list[bool], list[str | None]]:
    """Each row's verdict: (truncated: not a whole valid answer; why, None where it is one).

    Args:
        answers: [B, N] the generated ids within the budget (pad after EOS).
        complete: [B] bool, the automaton accepted each whole answer (`ConstraintGuide.complete`).
    """
    truncated, reasons = [], []
    for row, whole in zip(answers.tolist(), complete.tolist()):
        why = answer_problem(automaton, tokenizer, row, whole)
        if why is None and not whole:
            if len(answer_ids(row, automaton.end_ids)) < len(row):
                why = ended_early(automaton)
            else:
                why = f"max_new_tokens ran out before the {automaton.description} answer was complete"
        truncated.append(why is not None)
        reasons.append(why)
    return truncated, reasons
