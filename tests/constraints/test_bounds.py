"""Numeric bounds as regular expressions (constraints/bounds.py): integer ranges checked exhaustively on small ranges
and at random on large and negative ones, numbers against their bounds, and the schemas pydantic writes."""

import json
import random
import re

import jsonschema
import pytest

from diffusiongemma import JsonSchema
from diffusiongemma.constraints import ConstraintError
from diffusiongemma.constraints.bounds import integer_range_regex, number_regex

SMALL = list(range(-25, 26))


def spellings(lo_hi):
    """Canonical spellings of -130..130 and some non-canonical ones that must never match."""
    return [str(v) for v in range(-130, 131)] + ["-0", "00", "01", "-01", "007", "+1", "1.0", ""]


@pytest.mark.parametrize("lo", [None] + SMALL[::3])
def test_integer_ranges_exhaustive_on_small_ranges(lo):
    for hi in [None] + SMALL:
        regex = integer_range_regex(lo, hi)
        allowed = [v for v in range(-130, 131) if (lo is None or v >= lo) and (hi is None or v <= hi)]
        if regex is None:
            assert not allowed, (lo, hi)
            continue
        matched = [int(t) for t in spellings(None) if re.fullmatch(regex, t)]
        assert matched == allowed, (lo, hi, regex)


def test_integer_ranges_at_random_on_large_and_negative_ones():
    rng = random.Random(0)
    for _ in range(300):
        scale = 10 ** rng.randint(1, 12)
        lo, hi = sorted(rng.randint(-scale, scale) for _ in range(2))
        lo = None if rng.random() < 0.15 else lo
        hi = None if rng.random() < 0.15 else hi
        regex = re.compile(integer_range_regex(lo, hi))
        edges = [x for x in (lo, hi) if x is not None]
        probes = [rng.randint(-3 * scale, 3 * scale) for _ in range(60)] + [e + d for e in edges for d in (-1, 0, 1)]
        for v in probes:
            inside = (lo is None or v >= lo) and (hi is None or v <= hi)
            assert bool(regex.fullmatch(str(v))) == inside, (lo, hi, v)
        assert not regex.fullmatch("-0") and not regex.fullmatch("0" + str(abs(probes[0]) or 5))


def test_empty_integer_range_is_refused_by_name():
    assert integer_range_regex(5, 4) is None
    with pytest.raises(ConstraintError, match=r"no integer satisfies the bounds at schema"):
        JsonSchema({"type": "integer", "minimum": 3, "exclusiveMaximum": 3})


@pytest.mark.parametrize("bounds", [
    {"minimum": 0}, {"exclusiveMinimum": 0}, {"minimum": -3, "maximum": 2}, {"exclusiveMinimum": -3,
     "exclusiveMaximum": 2}, {"maximum": -1}, {"exclusiveMaximum": 0}, {"minimum": 1, "exclusiveMaximum": 1.0 + 1},
])
def test_number_bounds_accept_only_values_inside(bounds):
    regex = re.compile(number_regex({"type": "number", **bounds}, "schema"))
    rng = random.Random(1)
    texts = [f"{rng.uniform(-6, 6):.{rng.randint(0, 3)}f}" for _ in range(1500)]
    texts += ["0", "-0.5", "0.5", "2", "-3", "-2.999", "1.5", "3.0", "1e3"]
    schema = {"type": "number", **bounds}
    validator = jsonschema.Draft202012Validator(schema)
    matched = [t for t in texts if regex.fullmatch(t)]
    assert len(matched) > 50
    for t in matched:
        validator.validate(json.loads(t))  # every spelled value is inside
    # a value inside is reachable in its canonical spelling (exact for whole values, any fraction ending in 1-9)
    for t in ("0.25", "-0.25", "1.5", "-2.5", "1", "0", "-1", "2", "-3"):
        if validator.is_valid(json.loads(t)):
            assert regex.fullmatch(t), (bounds, t)


@pytest.mark.parametrize("schema, where", [
    ({"type": "number", "minimum": 0.5}, r"minimum=0.5 at schema.minimum"),
    ({"type": "number", "multipleOf": 2}, r"'multipleOf' at schema.multipleOf"),
    ({"type": "integer", "multipleOf": 3}, r"'multipleOf' at schema.multipleOf"),
    ({"type": "integer", "multipleOf": 1.5, "minimum": 0, "maximum": 9}, r"schema.multipleOf"),
    ({"type": "string", "minimum": 1}, r"bounds at schema need `type`"),
    ({"type": "integer", "minimum": True}, r"schema.minimum must be a finite number"),
    ({"enum": [1, 2], "type": "integer", "maximum": 1}, r"combines 'enum'"),
    ({"type": "object", "properties": {"a": {"type": "integer", "maximum": "3"}}},
     r"schema.properties.a.maximum must be a finite number"),
])
def test_unenforceable_bounds_are_refused_by_name(schema, where):
    with pytest.raises(ConstraintError, match=where):
        JsonSchema(schema)


def test_integer_multiple_of_with_bounds():
    schema = {"type": "integer", "minimum": -20, "maximum": 31, "multipleOf": 5}
    regex = re.compile(JsonSchema(schema).to_regex())
    assert [v for v in range(-40, 40) if regex.fullmatch(str(v))] == list(range(-20, 31, 5))


def test_bounds_inside_a_schema_compile_and_validate():
    schema = {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": ["number", "null"], "exclusiveMinimum": -1, "maximum": 1},
        "ids": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 99, "maximum": 1000}}},
        "required": ["age", "score", "ids"]}
    regex = re.compile(JsonSchema(schema).to_regex())
    good = ['{"age":0,"score":null,"ids":[]}', '{"age":130,"score":-0.5,"ids":[100,1000]}',
            '{"age":7,"score":1,"ids":[555]}']
    bad = ['{"age":131,"score":null,"ids":[]}', '{"age":-1,"score":0,"ids":[]}', '{"age":1,"score":1.5,"ids":[]}',
           '{"age":1,"score":-1,"ids":[]}', '{"age":1,"score":0,"ids":[99]}', '{"age":1,"score":0,"ids":[1001]}']
    for text in good:
        assert regex.fullmatch(text), text
        jsonschema.validate(json.loads(text), schema)
    for text in bad:
        assert not regex.fullmatch(text), text


def test_pydantic_schemas_work_unchanged():
    from typing import Literal, Optional

    from pydantic import BaseModel, Field, conint, constr

    class Pet(BaseModel):
        kind: Literal["cat", "dog"]
        age: conint(ge=0, le=30)

    class Owner(BaseModel):
        name: constr(pattern=r"^[A-Z][a-z]{1,8}$")
        pet: Pet
        nickname: Optional[str] = None
        rating: Optional[conint(gt=0, lt=6)] = None
        weight: float = Field(gt=0, le=500)

    schema = Owner.model_json_schema()
    assert "$defs" in schema and "exclusiveMinimum" in json.dumps(schema)
    regex = re.compile(JsonSchema(schema).to_regex())
    good = '{"name":"Ada","pet":{"kind":"cat","age":3},"nickname":null,"rating":5,"weight":12.5}'
    assert regex.fullmatch(good)
    Owner.model_validate_json(good)
    for bad in ('{"name":"Ada","pet":{"kind":"cat","age":31},"weight":1}',
                '{"name":"Ada","pet":{"kind":"cat","age":3},"rating":6,"weight":1}',
                '{"name":"Ada","pet":{"kind":"cat","age":3},"weight":0}'):
        assert not regex.fullmatch(bad), bad


def test_generated_answers_respect_the_bounds():
    """A random tiny model under a bounded schema: every answer validates (the bounds are in the automaton)."""
    import torch

    from conftest import tiny_model, tiny_tokenizer

    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": -5, "exclusiveMaximum": 120},
        "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 3},
        "k": {"type": "integer", "minimum": 0, "maximum": 40, "multipleOf": 7}}, "required": ["n", "x", "k"]}
    model, tok = tiny_model(), tiny_tokenizer()
    validator = jsonschema.Draft202012Validator(schema)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in range(3):
            ids = torch.randint(4, 100, (4, 5), generator=torch.Generator().manual_seed(seed))
            out = model.generate(ids, constraint=JsonSchema(schema), tokenizer=tok, max_new_tokens=48, seed=seed,
                                 sampling="fast", max_denoising_steps=4, eos_token_id=1, pad_token_id=0)
            assert not bool(out.truncated.any())
            for row in out.sequences:
                validator.validate(json.loads(tok.decode(row[5:], skip_special_tokens=True)))
    finally:
        torch.set_num_threads(threads)
