"""Regex / JsonSchema: construction, equality (the cache key) and every refusal, each naming its cause."""

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
])
def test_bad_schemas_are_refused_by_name(schema, message):
    with pytest.raises(ConstraintError, match=message):
        JsonSchema(schema)


def test_schema_outlines_cannot_compile_is_named():
    with pytest.raises(ConstraintError, match="outlines-core cannot compile this schema: Unsupported type: foo"):
        JsonSchema({"type": "foo"}).to_regex()
    with pytest.raises(ConstraintError, match="maxLength must be greater"):
        JsonSchema({"type": "string", "minLength": 3, "maxLength": 2}).to_regex()


def test_bad_regex_arguments():
    with pytest.raises(ConstraintError, match="must be a str"):
        Regex(3)
    with pytest.raises(ConstraintError, match="empty"):
        Regex("")


def test_constraint_type_is_checked():
    assert as_constraint(None) is None
    with pytest.raises(TypeError, match=r"diffusiongemma.Regex\(...\) or diffusiongemma.JsonSchema"):
        as_constraint("[0-9]+")
