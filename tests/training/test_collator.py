"""Tests of `diffusiongemma/training/collator.py` with the tiny character tokenizer (pad 0, eos 1)."""

import pytest
import torch

from diffusiongemma import DiffusionGemmaDataCollator
from diffusiongemma.training import RowError
from conftest import tiny_model, tiny_tokenizer

L = 16


@pytest.fixture
def collator():
    return DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L)


def ids(text):
    return tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


def test_prompt_completion_rows_become_left_padded_prompts_and_whole_canvases(collator):
    rows = [{"prompt": "abc", "completion": "x" * 20}, {"prompt": "a", "completion": "yz"}]
    batch = collator(rows)
    assert batch["input_ids"].tolist() == [ids("abc"), [0, 0] + ids("a")]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    labels = batch["labels"]
    assert labels.shape == (2, 2 * L)  # 20 tokens + EOS need two canvases
    assert labels[0].tolist() == ids("x" * 20) + [1] + [0] * 11  # EOS, then pad to the canvas end (scored)
    assert labels[1].tolist() == ids("yz") + [1] + [0] * 13 + [-100] * L  # one canvas; the second is batch padding


def test_a_response_that_fills_a_canvas_gets_its_eos_in_the_next(collator):
    labels = collator([{"prompt": "p", "completion": "x" * L}])["labels"]
    assert labels.shape == (1, 2 * L) and labels[0, L].item() == 1


def test_chat_rows_split_at_the_generation_prompt(collator):
    tok = tiny_tokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "model", "content": "yo"}]
    row = collator.tokenize({"messages": messages})
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert row["input_ids"] == list(prompt)
    assert row["labels"] == ids("yo</model>") + [1]  # the rest of the rendered turn, then EOS
    batch = collator([{"messages": messages}])
    assert batch["labels"].shape == (1, L)


def test_tokenized_rows_pass_through(collator):
    row = collator.tokenize({"prompt": "ab", "completion": "cd"})
    assert collator.tokenize(row) == row
    assert torch.equal(collator([row])["labels"], collator([{"prompt": "ab", "completion": "cd"}])["labels"])


@pytest.mark.parametrize("row, message", [
    ({"prompt": "a"}, r"needs 'prompt' and 'completion'.*got keys \['prompt'\]"),
    ({}, r"remove_unused_columns=False"),
    ({"prompt": 3, "completion": "x"}, r"'prompt' must be a string, got int"),
    ({"prompt": "a", "completion": ""}, r"'completion' is empty"),
    ({"prompt": "", "completion": "x"}, r"the prompt is empty"),
    ({"messages": [{"role": "user", "content": "hi"}]}, r"last message .* role 'assistant' or 'model', got 'user'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]},
     r"does not start with the prompt"),
    ({"messages": [{"content": "hi"}, {"role": "model", "content": "x"}]}, r"messages\[0\] must be an object"),
    ({"input_ids": [1, 2], "labels": [500]}, r"'labels' holds ids outside the tokenizer's vocabulary \[0, 128\)"),
    ("text", r"expected a JSON object"),
])
def test_bad_rows_name_the_row_and_field(collator, row, message):
    with pytest.raises(RowError, match=message):
        collator([{"prompt": "ok", "completion": "ok"}, row])
    with pytest.raises(RowError, match="^batch row 1: "):
        collator([{"prompt": "ok", "completion": "ok"}, row])


def test_max_length_refuses_instead_of_truncating():
    collator = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=L, max_length=10)
    collator([{"prompt": "abcd", "completion": "xyzuv"}])  # 4 + 6 = 10
    with pytest.raises(RowError, match="4 prompt \\+ 7 response tokens .* exceed max_length 10"):
        collator.tokenize({"prompt": "abcd", "completion": "xyzuvw"}, where="line 3 of d.jsonl")


def test_batches_train_the_model_through_forward(collator):
    model = tiny_model().train()
    rows = [{"prompt": "abc", "completion": "x" * 20}, {"prompt": "a", "completion": "yz"}]
    torch.manual_seed(0)
    out = model(**collator(rows))
    assert out.logits.shape == (2, 2 * L, 128) and torch.isfinite(out.loss)
    out.loss.backward()
    model.config.ar_loss_weight = 0.0  # the prompt then gets no loss at all
    assert model(**collator(rows)).ar_loss is None
