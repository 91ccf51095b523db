"""The schemas outlines-core used to express wrongly now give answers that validate, as text, over many seeds of a
tiny random model (only the constraint makes them valid): formats (email, date, date-time, time, uri, uuid),
property names that need escaping, `pattern` with a top-level `|`; a logits processor's bans are never overridden;
every answer is checked as its user decodes it (`truncation_reasons`)."""

import datetime
import json
import re
from unittest import mock

import jsonschema
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer

from diffusiongemma import JsonSchema, Regex

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = tiny_tokenizer()
KW = dict(max_denoising_steps=4, eos_token_id=1, pad_token_id=0, return_dict_in_generate=True)
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
SCHEMAS = {  # short answers: each fits a few canvases
    "email": {"type": "string", "format": "email"},
    "date": {"type": "array", "items": {"type": "string", "format": "date"}, "minItems": 2, "maxItems": 2},
    "date-time": {"type": "string", "format": "date-time"},
    "time": {"type": "string", "format": "time"},
    "uri": {"type": "string", "format": "uri"},
    "uuid": {"type": "string", "format": "uuid"},
    "escaped-names": {"type": "object", "properties": {'a"b': {"type": "boolean"}, "c\\d": {"type": "null"},
                                                       "e\nf": {"const": 1}}, "required": ['a"b', "c\\d", "e\nf"]},
    "pattern-alternation": {"type": "object", "properties": {"v": {"type": "string", "pattern": "^x+|y+$"}},
                            "required": ["v"]},
}


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def texts(out):
    return [TOK.decode(row[5:], skip_special_tokens=True) for row in out.sequences]


@pytest.mark.parametrize("name", SCHEMAS)
def test_answers_validate_with_formats_checked(model, name):
    schema = SCHEMAS[name]
    for seed in (0, 1):
        ids = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(seed))
        out = model.generate(ids, constraint=JsonSchema(schema), tokenizer=TOK, max_new_tokens=48, sampling="fast",
                             seed=seed, **KW)
        assert out.truncation_reasons == [None] * 3 and not bool(out.truncated.any())
        for text in texts(out):
            value = json.loads(text)
            jsonschema.validate(value, schema, format_checker=CHECKER)
            if name in ("date-time", "time"):  # jsonschema checks these only with rfc3339-validator installed
                datetime.datetime.fromisoformat(value if name == "date-time" else f"2000-01-01T{value}")


def digits_banned(input_ids, scores):
    scores[..., TOK.convert_tokens_to_ids(list("0123456789"))] = float("-inf")
    return scores


@pytest.mark.parametrize("mode", [dict(sampling="reference"), dict(sampling="fast", seed=0),
                                  dict(sampling="fast", seed=0, batching="mixed", max_batch_size=2)],
                         ids=["reference", "fast", "mixed"])
def test_a_processor_ban_is_never_overridden(model, mode, caplog):
    torch.manual_seed(0)
    ids = torch.randint(4, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, constraint=Regex("[0-9]{3}"), tokenizer=TOK, max_new_tokens=16,
                         logits_processor=[digits_banned], **mode, **KW)
    assert texts(out) == [""] * 3  # no digit brought back: the answer stops where nothing is possible
    assert out.truncated.tolist() == [True] * 3
    assert all("banned every token the constraint allowed" in why for why in out.truncation_reasons)
    assert "rows [0, 1, 2]" in caplog.text
    # where the constraint leaves a way around the ban, it is taken and the answer is complete
    out = model.generate(ids, constraint=Regex("a[0-9]?b"), tokenizer=TOK, max_new_tokens=16,
                         logits_processor=[digits_banned], **mode, **KW)
    assert texts(out) == ["ab"] * 3 and not bool(out.truncated.any())


def test_a_failed_final_check_is_reported_never_complete(model, caplog):
    # an answer the automaton accepts but the text check rejects (here: a schema check made to fail) is truncated,
    # with the reason naming it as our bug
    ids = torch.randint(4, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    with mock.patch("diffusiongemma.constraints.answer_check.schema_problem", return_value="the answer fails X"):
        out = model.generate(ids, constraint=JsonSchema({"type": "boolean"}), tokenizer=TOK, max_new_tokens=16,
                             sampling="fast", seed=0, **KW)
    assert out.truncated.tolist() == [True, True]
    assert all(re.search("fails X .*a bug of diffusiongemma", why) for why in out.truncation_reasons)
    assert "a bug of diffusiongemma" in caplog.text
