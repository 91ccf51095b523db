"""Regex / JsonSchema: construction, equality (the cache key) and every refusal, each naming its cause."""

import re

import pytest

from diffusiongemma import ConstraintError, JsonSchema, Regex
from diffusiongemma.constraints import as_constraint


def test_schema_from_dict_and_string_are_one_constraint():
    a = JsonSchema({"type": "integer"})
    b = JsonSchema('{"type": "integer"}')
    assert a == b and hash(a) == hash(b)
    assert a != JsonSchema({"type": "number"})
    assert Regex("a+") == Regex("a+") and Regex("a+") != Regex("b+")


def test_schema_regex_comes_from_outlines_core():
    assert JsonSchema({"enum": ["cat", "dog"]}).to_regex() == '("cat"|"dog")'


def test_what_outlines_core_writes_wrongly_is_rewritten():
    # property names JSON-escaped (outlines-core writes them raw), patterns grouped and unanchored, exact formats
    regex = JsonSchema({"type": "object", "properties": {'a"b': {"type": "null"}}, "required": ['a"b']}).to_regex()
    assert re.fullmatch(regex, '{"a\\"b":null}') and not re.fullmatch(regex, '{"a"b":null}')
    assert JsonSchema({"type": "string", "pattern": "^a|b$"}).to_regex() == '("(?:a|b)")'
    date = JsonSchema({"type": "string", "format": "date"}).to_regex()
    assert re.fullmatch(date, '"2024-02-29"') and not re.fullmatch(date, '"2023-02-29"')
    assert not re.fullmatch(date, '"2023-02-31"')


@pytest.mark.parametrize("schema, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({"type": "number", "minimum": 0.5}, r"unsupported bound minimum=0.5 at schema.minimum"),
    ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
     r"'uniqueItems' at schema.properties.a.uniqueItems"),
    ({"not": {"type": "string"}}, "unsupported keyword 'not'"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "schema.oneOf with 2 schemas"),
    ({"allOf": [{"type": "integer"}, {"type": "integer"}]}, "schema.allOf with 2 schemas"),
    ({"anyOf": []}, "schema.anyOf must be a non-empty list"),
    ({"type": "string", "format": "ipv4"}, "unsupported format 'ipv4' at schema.format"),
    ({"properties": {"a": 3}}, "schema.properties.a must be a schema object"),
    ({"type": "foo"}, "schema.type is not a valid JSON schema"),  # jsonschema's own check of the schema
    # what outlines-core would drop or write as invalid JSON (schema_rules.py)
    ({"type": "object", "properties": {"v": {"type": "integer"}, "n": {"$ref": "#"}}},
     r"recursive \$ref '#' at schema.properties.n.\$ref"),
    ({"$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "$ref": "#/$defs/t"},
     r"recursive \$ref '#/\$defs/t' at schema.\$ref.items.\$ref"),
    ({"$ref": "#/$defs/nope"}, r"schema.\$ref = '#/\$defs/nope' points at nothing"),
    ({"$ref": "https://example.com/s.json"}, "only local references"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
     r"schema.required names \['b'\], which schema.properties does not define"),
    ({"type": "object", "required": ["b"]}, r"schema.required names \['b'\]"),
    ({"type": "string", "const": 3}, r"schema.const = 3 contradicts its sibling keywords \['type'\]"),
    ({"type": "object", "properties": {"k": {"type": "integer", "enum": [1, "x"]}}},
     r"schema.properties.k.enum\[1\] = \"x\" contradicts"),
    ({"enum": [1], "const": 1}, "both enum and const"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"type": "object"}]},
     r"schema.anyOf beside \['type', 'properties'\] is not supported"),
    ({"properties": {"x": {"$ref": "#/$defs/d", "type": "integer"}}, "$defs": {"d": {"type": "integer"}}},
     r"schema.properties.x.\$ref beside \['type'\]"),
    ({"allOf": [{"type": "integer"}], "oneOf": [{"type": "integer"}]}, r"schema.oneOf beside \['allOf'\]"),
    ({"type": "string", "format": "date", "maxLength": 3}, r"schema.format beside \['maxLength'\]"),
    ({"type": "string", "pattern": "a+", "minLength": 3}, r"schema.pattern beside \['minLength'\]"),
    ({"type": "integer", "format": "date"}, "schema.format is only supported with type 'string'"),
    ({"type": "string", "pattern": "("}, r"schema.pattern is not a valid JSON schema: '\(' is not a 'regex'"),
])
def test_bad_schemas_are_refused_by_name(schema, message):
    with pytest.raises(ConstraintError, match=message):
        JsonSchema(schema)


def test_schema_outlines_cannot_compile_is_named():
    with pytest.raises(ConstraintError, match="maxLength must be greater"):
        JsonSchema({"type": "string", "minLength": 3, "maxLength": 2}).to_regex()


@pytest.mark.parametrize("pattern, regex", [("^ab$", "ab"), ("[^a]b$", "[^a]b"), (r"a\$", r"a\$"), ("^a|b$", "a|b")])
def test_regex_anchors_at_the_ends_are_accepted(pattern, regex):
    assert Regex(pattern).to_regex() == regex


@pytest.mark.parametrize("pattern, where", [("a^b", "'^' at offset 1"), ("(^a)", "'^' at offset 1"),
                                            ("a$b", "'$' at offset 1")])
def test_regex_anchors_inside_are_refused(pattern, where):
    with pytest.raises(ConstraintError, match=rf"Regex pattern .*anchor {re.escape(where)} is not supported"):
        Regex(pattern)


def test_bad_regex_arguments():
    with pytest.raises(ConstraintError, match="must be a str"):
        Regex(3)
    with pytest.raises(ConstraintError, match="empty"):
        Regex("")


def test_constraint_type_is_checked():
    assert as_constraint(None) is None
    with pytest.raises(TypeError, match=r"diffusiongemma.Regex\(...\) or diffusiongemma.JsonSchema"):
        as_constraint("[0-9]+")
