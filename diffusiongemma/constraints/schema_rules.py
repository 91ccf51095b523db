"""What a JSON schema must satisfy before outlines-core turns it into a regex, and the schema outlines-core is given.

outlines-core drops some keywords without a word: `required` names that `properties` lacks, `type` beside `enum` or
`const`, every sibling of `anyOf` / `oneOf` / `allOf` / `$ref`, `minLength` beside `pattern` or `format`, and it
unrolls a recursive `$ref` into a regex whose deepest level is not JSON. `check_schema` refuses each of these,
naming the keyword and its place (`schema.properties.a.required`). `outlines_schema` rewrites what can be expressed
exactly: property names JSON-escaped (outlines-core writes them raw), the formats as the exact regexes of formats.py,
and each `pattern` grouped (outlines-core writes `"` + pattern + `"`, so a top-level `|` would split the quotes) with
its `^` / `$` dropped (the answer's string must match it whole anyway).
"""

import copy
import json

from .errors import ConstraintError
from .formats import FORMAT_REGEX

# keywords that constrain nothing by themselves (annotations, and definitions only used through `$ref`)
NOT_CONSTRAINING = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated",
                    "readOnly", "writeOnly", "$defs", "definitions"}
COMPOSITION = ("anyOf", "oneOf", "allOf", "$ref")
STRING_SHAPES = ("pattern", "format")  # outlines-core keeps one of these and drops minLength / maxLength


def subschemas(node: dict, where: str):
    """(sub-schema, its place) for every schema directly inside `node`."""
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (node.get(key) or {}).items():
            yield sub, f"{where}.{key}.{name}"
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(key) or []):
            yield sub, f"{where}.{key}[{i}]"
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield node[key], f"{where}.{key}"


def resolve_ref(root: dict, ref, where: str) -> dict:
    """The sub-schema a local `$ref` (`#`, `#/$defs/name`, ...) points at."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ConstraintError(f"JsonSchema: {where} = {ref!r}: only local references (`#`, `#/$defs/...`) are "
                              f"supported")
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise ConstraintError(f"JsonSchema: {where} = {ref!r} points at nothing in the schema")
    return node


def check_schema(schema: dict) -> None:
    """Refuse, naming the keyword and its place, what outlines-core would drop or express wrongly.

    Raises:
        ConstraintError: an invalid schema (jsonschema's own check), a recursive or non-local `$ref`, `required`
            naming an undefined property, an `enum` / `const` value its sibling keywords reject, a composition
            keyword beside other keywords, or `pattern` / `format` beside `minLength` / `maxLength`.
    """
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        place = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise ConstraintError(f"JsonSchema: schema{place} is not a valid JSON schema: {error.message}") from None
    done: set[str] = set()

    def walk(node, where: str, refs: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        check_node(node, where)
        if "$ref" in node:
            ref = node["$ref"]
            target = resolve_ref(schema, ref, f"{where}.$ref")
            if ref in refs:
                raise ConstraintError(f"JsonSchema: recursive $ref {ref!r} at {where}.$ref: the answer's nesting would "
                                      f"be unbounded, which a regular expression cannot express")
            if ref not in done:
                walk(target, f"{where}.$ref", refs + (ref,))
                done.add(ref)
        for sub, place in subschemas(node, where):
            walk(sub, place, refs)

    walk(schema, "schema", ("#",))


def check_node(node: dict, where: str) -> None:
    """The checks of one schema object (its sub-schemas are walked by `check_schema`)."""
    from jsonschema.validators import validator_for

    constraining = [k for k in node if k not in NOT_CONSTRAINING]
    composed = [k for k in COMPOSITION if k in node]
    if composed and len(constraining) > 1:
        others = [k for k in constraining if k != composed[0]]
        raise ConstraintError(f"JsonSchema: {where}.{composed[0]} beside {others} is not supported: only one of them "
                              f"would be enforced (move the other keywords into each branch)")
    if "required" in node:
        defined = node.get("properties") or {}
        missing = [name for name in node["required"] if name not in defined]
        if missing:
            raise ConstraintError(f"JsonSchema: {where}.required names {missing}, which {where}.properties does not "
                                  f"define: constrained decoding only writes the properties it lists")
    if "enum" in node and "const" in node:
        raise ConstraintError(f"JsonSchema: {where} has both enum and const: give one")
    for key in ("enum", "const"):
        if key not in node:
            continue
        rest = {k: v for k, v in node.items() if k not in ("enum", "const") and k not in NOT_CONSTRAINING}
        values = node[key] if key == "enum" else [node[key]]
        if rest:
            validator = validator_for(rest)(rest)
            for i, value in enumerate(values):
                if not validator.is_valid(value):
                    place = f"{where}.enum[{i}]" if key == "enum" else f"{where}.const"
                    raise ConstraintError(f"JsonSchema: {place} = {json.dumps(value)} contradicts its sibling "
                                          f"keywords {sorted(rest)}: no answer could satisfy both")
    shapes = [k for k in STRING_SHAPES if k in node]
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    if len(shapes) > 1 or (shapes and lengths):
        raise ConstraintError(f"JsonSchema: {where}.{shapes[0]} beside {(shapes[1:] + lengths)} is not supported: only "
                              f"one of them would be enforced")
    if "format" in node and node.get("type", "string") != "string":
        raise ConstraintError(f"JsonSchema: {where}.format is only supported with type 'string', got "
                              f"{node['type']!r}")


def json_escaped(name: str) -> str:
    """A property name as it appears between the quotes of a JSON document."""
    return json.dumps(name, ensure_ascii=False)[1:-1]


def strip_anchors(pattern: str) -> str:
    """`pattern` without one leading `^` and one trailing unescaped `$`."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and (len(pattern) - len(pattern[:-1].rstrip("\\")) - 1) % 2 == 0:
        pattern = pattern[:-1]
    return pattern


def outlines_schema(schema: dict) -> dict:
    """The schema as outlines-core should see it (a copy): escaped property names, exact format regexes, grouped
    patterns. Run `check_schema` first."""

    def rewrite(node):
        if not isinstance(node, dict):
            return node
        node = dict(node)
        if "properties" in node:
            node["properties"] = {json_escaped(k): rewrite(v) for k, v in node["properties"].items()}
        if "required" in node:
            node["required"] = [json_escaped(k) for k in node["required"]]
        for key in ("$defs", "definitions"):
            if key in node:
                node[key] = {k: rewrite(v) for k, v in node[key].items()}
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if key in node:
                node[key] = [rewrite(v) for v in node[key]]
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                node[key] = rewrite(node[key])
        if "format" in node:
            node["type"] = "string"
            node["pattern"] = FORMAT_REGEX[node.pop("format")]
        if "pattern" in node:
            node["pattern"] = f"(?:{strip_anchors(node['pattern'])})"
        return node

    return rewrite(copy.deepcopy(schema))
