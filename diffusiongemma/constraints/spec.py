"""What a user constrains an answer to: `Regex(pattern)` or `JsonSchema(schema)`, each reduced to one regular
expression over the answer's text (outlines-core turns a JSON schema into one).

A schema keyword the regex cannot enforce (`uniqueItems`, `not`, ...) is refused by name instead of being
ignored, so every answer that matches the regex also validates against the schema.
"""

import json
from dataclasses import dataclass, field

from .bounds import BOUND_KEYWORDS, replace_markers, with_bound_markers
from .errors import ConstraintError
from .schema_rules import check_schema, outlines_schema, strip_anchors

# Keywords whose meaning outlines-core's regex enforces (or that only annotate). Anything else is refused.
ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated", "readOnly",
               "writeOnly"}
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
            "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
            "pattern", "format", *BOUND_KEYWORDS}  # bounds: bounds.py writes their regex
FORMATS = {"date-time", "date", "time", "uuid", "email", "uri"}


@dataclass(frozen=True)
class Regex:
    """Every answer fully matches `pattern` (Rust `regex` syntax, as outlines-core reads it; no look-around or
    back-references). The answer is the generated text up to EOS, without the prompt.

    Args:
        pattern: the regular expression; anchored at both ends (a leading `^` and a trailing `$` are accepted and
            change nothing; anchors anywhere else are refused).
    """

    pattern: str

    def __post_init__(self):
        if not isinstance(self.pattern, str):
            raise ConstraintError(f"Regex pattern must be a str, got {type(self.pattern).__name__}")
        if not self.pattern:
            raise ConstraintError("Regex pattern is empty: it would allow only the empty answer")
        inner = inner_anchor(strip_anchors(self.pattern))
        if inner is not None:
            raise ConstraintError(f"Regex pattern {self.pattern!r}: anchor {inner[1]!r} at offset {inner[0]} is not "
                                  f"supported (the whole answer must match the pattern: `^` and `$` are accepted only "
                                  f"at its two ends)")

    def to_regex(self) -> str:
        return strip_anchors(self.pattern)

    def describe(self) -> str:
        return f"Regex({self.pattern!r})"


@dataclass(frozen=True)
class JsonSchema:
    """Every answer is one JSON value (compact: at most one space around `:` and `,`) that validates against
    `schema`. Objects list their properties in the schema's order; optional properties may be left out.

    Args:
        schema: a dict, or the schema as a JSON string.
        whitespace: the regex of the whitespace allowed between tokens (outlines-core's default `[ ]?` if None).
    """

    schema: dict | str = field(compare=False)
    whitespace: str | None = None
    text: str = field(init=False, repr=False, compare=True)

    def __post_init__(self):
        schema = self.schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ConstraintError(f"JsonSchema: the schema string is not valid JSON: {error}") from None
        if not isinstance(schema, dict):
            raise ConstraintError(f"JsonSchema: the schema must be a JSON object (a dict), got "
                                  f"{type(schema).__name__}")
        check_keywords(schema, "schema")
        with_bound_markers(schema)  # refuses bounds it cannot enforce, naming their place
        check_schema(schema)
        object.__setattr__(self, "text", json.dumps(schema, sort_keys=False))

    def to_regex(self) -> str:
        from outlines_core.json_schema import build_regex_from_schema

        schema, markers = with_bound_markers(self.as_dict())
        try:
            regex = build_regex_from_schema(json.dumps(outlines_schema(schema)), self.whitespace)
        except (ValueError, TypeError) as error:
            raise ConstraintError(f"JsonSchema: outlines-core cannot compile this schema: {error}") from None
        return replace_markers(regex, markers, self.text)

    def as_dict(self) -> dict:
        """The schema as a dict (a fresh copy)."""
        return json.loads(self.text)

    def describe(self) -> str:
        return f"JsonSchema({self.text[:80]}{'...' if len(self.text) > 80 else ''})"


def check_keywords(node, where: str) -> None:
    """Refuse, naming its place, every keyword the regex would not enforce; recurse into sub-schemas."""
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise ConstraintError(f"JsonSchema: {where} must be a schema object, got {node!r}")
    for key, value in node.items():
        here = f"{where}.{key}"
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            raise ConstraintError(f"JsonSchema: unsupported keyword {key!r} at {here}: constrained decoding cannot "
                                  f"enforce it (supported: {sorted(ENFORCED)})")
        if key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise ConstraintError(f"JsonSchema: {here} must be an object of schemas")
            for name, sub in value.items():
                check_keywords(sub, f"{here}.{name}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise ConstraintError(f"JsonSchema: {here} must be a non-empty list of schemas")
            if key in ("oneOf", "allOf") and len(value) > 1:
                # outlines-core writes oneOf as anyOf (an answer may match two branches) and allOf as a
                # concatenation: neither would validate
                raise ConstraintError(f"JsonSchema: {here} with {len(value)} schemas is not supported (only one; use "
                                      f"anyOf for alternatives)")
            for i, sub in enumerate(value):
                check_keywords(sub, f"{here}[{i}]")
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            check_keywords(value, here)
        elif key == "format" and value not in FORMATS:
            raise ConstraintError(f"JsonSchema: unsupported format {value!r} at {here} (supported: {sorted(FORMATS)})")


def inner_anchor(pattern: str) -> tuple[int, str] | None:
    """(offset, character) of the first `^` or `$` that is an anchor (not escaped, not inside `[...]`), or None."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1
            i += pattern.startswith("^", i)  # a negated class
            i += pattern.startswith("]", i)  # a literal `]` first in the class
            continue
        elif c in "^$":
            return i, c
        i += 1
    return None


def as_constraint(value):
    """A `Regex`, `JsonSchema` or `ToolCalls` as given, or a clear error for anything else (None passes through)."""
    from .tools import ToolCalls

    if value is None or isinstance(value, (Regex, JsonSchema, ToolCalls)):
        return value
    raise TypeError(f"`constraint` must be diffusiongemma.Regex(...) or diffusiongemma.JsonSchema(...) (or "
                    f"diffusiongemma.ToolCalls(...)), got {type(value).__name__}")
