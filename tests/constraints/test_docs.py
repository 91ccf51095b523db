"""docs/constraints.md's first example runs as written on a tiny random model, and its answer validates."""

import json
import pathlib
import re

import jsonschema
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer

DOC = pathlib.Path(__file__).parents[2] / "docs" / "constraints.md"


@pytest.mark.usefixtures("one_thread")
def test_first_example_runs_and_validates():
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    model = tiny_model()
    model.generation_config.max_denoising_steps = 3
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0
    namespace = {"model": model, "tok": tiny_tokenizer(), "ids": torch.tensor([[40, 50, 60]])}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own docs
    jsonschema.validate(json.loads(namespace["text"]), namespace["schema"])
    assert namespace["out"].truncated.tolist() == [False]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}",
                        namespace["tok"].decode(namespace["out"].sequences[0, 3:], skip_special_tokens=True))
