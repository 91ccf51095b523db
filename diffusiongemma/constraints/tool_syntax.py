"""Gemma 4's tool-call syntax as regular expressions, the arguments constrained by a function's JSON schema.

A call, as Gemma 4's chat template writes it and transformers serve's `gemma4` response template reads it:

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,units:[<|"|>C<|"|>]}<tool_call|>

Keys are bare identifiers; a string is its literal text between two `<|"|>` (no escapes, so the text never holds
`<|`); numbers, `true`, `false` and `null` are written as in JSON; objects `{k:v,...}` and arrays `[v,...]` have no
spaces. `value_regex(schema)` writes the values a schema allows in this syntax (properties in the schema's order,
optional ones left out or present), reading the same keywords as `JsonSchema` (spec.py) and the numeric bounds
(bounds.py); `format` and `pattern` borrow outlines-core's regex of the string's content.
"""

import json

from .bounds import BOUND_KEYWORDS, bounded_regex
from .errors import ConstraintError

CALL_OPEN, CALL_CLOSE, QUOTE, CALL_PREFIX = "<|tool_call>", "<tool_call|>", '<|"|>', "call:"
SPECIAL_TEXTS = (CALL_OPEN, CALL_CLOSE, QUOTE)  # special tokens of Gemma 4's tokenizer a call spells
KEY = r"[A-Za-z_][A-Za-z0-9_]*"
META = set("\\.+*?()|[]{}^$#&-~")
# Text without "<|" (never a call marker, never a special token's text), written so that no branch can end where
# another goes on with the same character: outlines-core's automaton keeps only the first-priority parse, so
# `a*(?:ab)?` would lose "aab" (measured: tests/constraints/test_tools.py checks a call is still reachable).
TEXT = r"(?:[^<]|<+[^<|])*"  # text whose every "<" run is followed by another character
FREE_TEXT = TEXT + "<*"  # any text without "<|"
STRING_TEXT = r"(?:[^<\x00-\x1f]|<+[^<|\x00-\x1f])*"  # a string's text: no control characters, no "<|", no "<" last
SHORT_CHAR = r"[^<\x00-\x1f]"  # one character of a string with a length bound
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
MAX_REF_DEPTH = 3  # a recursive $ref is unrolled this deep, then only its non-recursive alternatives remain
ANY_DEPTH = 2  # a schema-less value (`{}` or an object without properties) nests at most this deep


def literal(text: str) -> str:
    """`text` as a regex that matches exactly it (`<` and `>` stay bare: `\\<` is a word boundary in Rust)."""
    return "".join("\\" + c if c in META else c for c in text)


QUOTE_RE = literal(QUOTE)
CUT = "(?!)"  # a $ref branch unrolled too deep: never a regex outlines-core sees (alternatives drop it)


def gemma_literal(value) -> str:
    """A JSON value written in the call syntax (for `enum` and `const`)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(gemma_literal(v) for v in value) + "]"
    return "{" + ",".join(f"{k}:{gemma_literal(v)}" for k, v in value.items()) + "}"


def alternatives(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def any_value(depth: int) -> str:
    """Any value nested at most `depth` deep (a schema that says nothing about it)."""
    scalars = [QUOTE_RE + STRING_TEXT + QUOTE_RE, NUMBER, "true", "false", "null"]
    if depth > 0:
        inner = any_value(depth - 1)
        scalars += [r"\[(?:" + inner + "(?:," + inner + r")*)?\]",
                    r"\{(?:" + KEY + ":" + inner + "(?:," + KEY + ":" + inner + r")*)?\}"]
    return alternatives(scalars)



def string_regex(node: dict, where: str) -> str:
    """A string's content: its `pattern` or `format` (outlines-core's regex, without the JSON quotes), a length
    range, or any text without `<|`."""
    if "pattern" in node or "format" in node:
        if "pattern" in node:
            content = node["pattern"].removeprefix("^").removesuffix("$")
        else:
            from outlines_core.json_schema import build_regex_from_schema

            quoted = build_regex_from_schema(json.dumps({"type": "string", "format": node["format"]}))
            content = quoted[1:-1]  # the format's regex between its '"' and '"'
        return QUOTE_RE + "(?:" + content + ")" + QUOTE_RE
    if "minLength" in node or "maxLength" in node:
        low = int(node.get("minLength", 0))
        high = node.get("maxLength")
        return QUOTE_RE + SHORT_CHAR + "{" + f"{low}," + (str(int(high)) if high is not None else "") + "}" + QUOTE_RE
    return QUOTE_RE + STRING_TEXT + QUOTE_RE


def object_regex(node: dict, context: "Context", where: str) -> str:
    """`{k:v,...}`: the schema's properties in its order, required ones always, optional ones present or not."""
    properties = node.get("properties")
    if not properties:
        if properties == {} or node.get("additionalProperties") is False:  # a function without arguments
            return r"\{\}"
        inner = any_value(ANY_DEPTH - 1)
        return r"\{(?:" + KEY + ":" + inner + "(?:," + KEY + ":" + inner + r")*)?\}"
    required = set(node.get("required", []))
    unknown = required - set(properties)
    if unknown:
        raise ConstraintError(f"JsonSchema: {where}.required names {sorted(unknown)}, which are not in properties")
    pairs = []
    for name, sub in properties.items():
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise ConstraintError(f"JsonSchema: property name {name!r} at {where}.properties: a tool argument's name "
                                  "must be an identifier (Gemma's call syntax writes keys bare)")
        pairs.append((name + ":" + value_regex(sub, context, f"{where}.properties.{name}"), name in required))

    def rest(i: int, written: bool) -> str:  # the properties from i on, given whether one was written before
        if i == len(pairs):
            return ""
        pair, needed = pairs[i]
        lead = "," if written else ""
        if needed:
            return lead + pair + rest(i + 1, True)
        if written:
            return "(?:," + pair + ")?" + rest(i + 1, True)
        return "(?:" + pair + rest(i + 1, True) + "|" + rest(i + 1, False) + ")"

    return r"\{" + rest(0, False) + r"\}"


def array_regex(node: dict, context: "Context", where: str) -> str:
    items = node.get("items")
    item = value_regex(items, context, f"{where}.items") if isinstance(items, dict) else any_value(ANY_DEPTH - 1)
    low, high = int(node.get("minItems", 0)), node.get("maxItems")
    if node.get("prefixItems"):
        raise ConstraintError(f"JsonSchema: 'prefixItems' at {where}.prefixItems is not supported in tool arguments")
    if high is not None and int(high) == 0:
        return r"\[\]"
    more = "{" + f"{max(low - 1, 0)}," + (str(int(high) - 1) if high is not None else "") + "}"
    body = item + "(?:," + item + ")" + more
    return r"\[" + (body if low > 0 else "(?:" + body + ")?") + r"\]"


class Context:
    """The schema's root (for `$ref`) and how deep each reference is unrolled."""

    def __init__(self, root: dict):
        self.root, self.depth = root, {}

    def resolve(self, ref: str, where: str) -> dict | None:
        if not ref.startswith("#/"):
            raise ConstraintError(f"JsonSchema: {where}.$ref {ref!r}: only local references (#/$defs/...) work")
        node = self.root
        for part in ref[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                raise ConstraintError(f"JsonSchema: {where}.$ref {ref!r} points nowhere")
            node = node[part]
        return node


def value_regex(node, context: Context, where: str) -> str:
    """The values `node` (a JSON schema) allows, in the call syntax."""
    if node is True or node == {}:
        return any_value(ANY_DEPTH)
    if node is False:
        raise ConstraintError(f"JsonSchema: {where} is false: no value is allowed")
    if "$ref" in node:
        ref = node["$ref"]
        depth = context.depth.get(ref, 0)
        if depth >= MAX_REF_DEPTH:
            return CUT
        context.depth[ref] = depth + 1
        try:
            return value_regex(context.resolve(ref, where), context, f"{where}.$ref")
        finally:
            context.depth[ref] = depth
    if "const" in node:
        return literal(gemma_literal(node["const"]))
    if "enum" in node:
        return alternatives([literal(gemma_literal(v)) for v in node["enum"]])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            parts = [value_regex(sub, context, f"{where}.{key}[{i}]") for i, sub in enumerate(node[key])]
            parts = [p for p in parts if CUT not in p] or [CUT]
            return alternatives(parts)
    kinds = node.get("type")
    if kinds is None:
        return any_value(ANY_DEPTH)
    if isinstance(kinds, list):
        return alternatives([value_regex({**node, "type": k}, context, where) for k in kinds])
    if any(k in node for k in BOUND_KEYWORDS) and kinds in ("integer", "number"):
        return bounded_regex(node, where)
    if kinds == "string":
        return string_regex(node, where)
    if kinds == "integer":
        return INTEGER
    if kinds == "number":
        return NUMBER
    if kinds == "boolean":
        return "(?:true|false)"
    if kinds == "null":
        return "null"
    if kinds == "object":
        return object_regex(node, context, where)
    if kinds == "array":
        return array_regex(node, context, where)
    raise ConstraintError(f"JsonSchema: unknown type {kinds!r} at {where}.type")


def arguments_regex(parameters: dict, where: str) -> str:
    """The `{...}` of one function's call, from its `parameters` schema (already checked by `JsonSchema`)."""
    regex = value_regex(parameters, Context(parameters), where)
    if CUT in regex:
        raise ConstraintError(f"JsonSchema: {where}: the recursive $ref leaves no finite value")
    return regex


def call_body_regex(name: str, parameters: dict, where: str) -> str:
    """One call of function `name` after its `<|tool_call>`: `call:NAME{...}<tool_call|>`."""
    return literal(CALL_PREFIX + name) + arguments_regex(parameters, where) + literal(CALL_CLOSE)


def calls_regex(bodies: list[str], parallel: bool, after_text: bool) -> str:
    """One call (or several, with `parallel`) of the given call bodies; with `after_text`, free text first and the
    calls optional (the "<" runs of the text and the call's first "<" share one branch, see TEXT)."""
    one = alternatives(bodies)
    more = f"(?:{literal(CALL_OPEN)}{one})*" if parallel else ""
    if after_text:
        return TEXT + r"(?:<+(?:\|" + literal(CALL_OPEN[2:]) + one + more + ")?)?"
    return f"(?:{literal(CALL_OPEN)}{one})+" if parallel else literal(CALL_OPEN) + one
