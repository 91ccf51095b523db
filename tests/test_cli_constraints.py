"""`diffusiongemma generate --regex P` and `--json-schema FILE`: the printed answer matches, a budget that runs out
exits 3 with a message, and bad arguments are one clear line naming them."""

import json
import re

import jsonschema
import pytest

from diffusiongemma.cli import main

ARGS = ["--max-new-tokens", "32", "--steps", "2", "--seed", "3", "--quiet"]
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["id", "ok"]}


@pytest.mark.parametrize("sampling", ["reference", "fast"])
def test_regex(saved_pair, capsys, sampling):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), *ARGS, "--sampling", sampling, "--regex", "[a-f]{4}-[0-9]+",
                 "hi"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert re.fullmatch("[a-f]{4}-[0-9]+", text), text


def test_json_schema_file(saved_pair, capsys, tmp_path):
    path, _, _ = saved_pair
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert main(["generate", "--model", str(path), *ARGS, "--json-schema", str(schema), "hi"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), SCHEMA)


def test_budget_ran_out(saved_pair, capsys):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), *ARGS, "--regex", "[a-z]{200}", "hi"]) == 3
    assert "max_new_tokens ran out before the" in capsys.readouterr().err


def test_bad_arguments(saved_pair, capsys, tmp_path):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), *ARGS, "--regex", "(", "hi"]) == 1
    assert "malformed or unsupported regular expression" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    assert main(["generate", "--model", str(path), *ARGS, "--json-schema", str(bad), "hi"]) == 1
    assert f"--json-schema {bad}: not JSON (line 2" in capsys.readouterr().err
    assert main(["generate", "--model", str(path), *ARGS, "--json-schema", str(tmp_path / "none.json"), "hi"]) == 1
    assert "cannot read it" in capsys.readouterr().err
    bad.write_text(json.dumps({"type": "array", "uniqueItems": True}))  # (maximum is supported now: bounds.py)
    assert main(["generate", "--model", str(path), *ARGS, "--json-schema", str(bad), "hi"]) == 1
    assert "unsupported keyword 'uniqueItems'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--model", str(path), "--regex", "a", "--json-schema", str(bad), "hi"])
