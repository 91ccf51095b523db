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


# ---- the canvas length: model= or canvas_length= (transformers' collator convention) ----

def test_the_canvas_length_comes_from_the_model():
    model = tiny_model()
    assert DiffusionGemmaDataCollator(tiny_tokenizer(), model=model).canvas_length == L
    assert DiffusionGemmaDataCollator(tiny_tokenizer(), model, canvas_length=L).canvas_length == L


@pytest.mark.parametrize("kwargs, error, message", [
    ({}, TypeError, r"needs the canvas length: pass model= .* or canvas_length="),
    ({"canvas_length": 8, "model": "model"}, ValueError, r"canvas_length=8 disagrees with the model's "
                                                         r"config.canvas_length=16"),
    ({"canvas_length": 0}, ValueError, r"canvas_length must be a positive int, got 0"),
    ({"model": object()}, TypeError, r"model= must be a DiffusionGemma model"),
])
def test_a_missing_or_wrong_canvas_length_is_named(kwargs, error, message):
    if kwargs.get("model") == "model":
        kwargs["model"] = tiny_model()
    with pytest.raises(error, match=message):
        DiffusionGemmaDataCollator(tiny_tokenizer(), **kwargs)


def test_a_positional_canvas_length_is_told_to_use_the_keyword():
    with pytest.raises(TypeError, match=r"the second argument is the model; pass canvas_length=16 by keyword"):
        DiffusionGemmaDataCollator(tiny_tokenizer(), 16)


def test_a_batch_for_another_canvas_length_is_refused_by_the_model():
    wrong = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=8)
    batch = wrong([{"prompt": "abc", "completion": "x" * 20}])  # 3 canvases of 8 = 24, not a multiple of 16 ...
    batch = wrong([{"prompt": "abc", "completion": "x" * 30}])  # ... but 4 canvases of 8 are 2 of 16: silent before
    assert batch["labels"].shape == (1, 32) and batch["labels_canvas_length"].item() == 8
    with pytest.raises(ValueError, match=r"laid out for canvas_length=8 .* config.canvas_length is 16"):
        tiny_model().train()(**batch)


def test_trainer_with_a_wrong_canvas_length_collator_stops(tmp_path):
    from transformers import Trainer, TrainingArguments

    wrong = DiffusionGemmaDataCollator(tiny_tokenizer(), canvas_length=8)
    trainer = Trainer(model=tiny_model().train(), data_collator=wrong,
                      train_dataset=[{"prompt": "abc", "completion": "x" * 30}] * 2,
                      args=TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1,
                                             remove_unused_columns=False, disable_tqdm=True, save_strategy="no"))
    with pytest.raises(ValueError, match=r"canvas_length=8 .* config.canvas_length is 16"):
        trainer.train()


# ---- text is data: special-token text in rows stays text ----

def test_eos_text_in_a_completion_or_prompt_stays_text(collator):
    batch = collator([{"prompt": "say <eos> now", "completion": "a<eos>b"}])
    assert batch["input_ids"][0].tolist() == ids("say <") + ids("eos> now")
    labels = batch["labels"][0].tolist()
    assert labels[:8] == ids("a<") + ids("eos>b") + [1]  # characters, then the one real EOS
    assert labels[:8].count(1) == 1


def test_special_token_text_in_chat_messages_stays_text_and_the_template_keeps_its_control_tokens():
    from vision_builders import tiny_media_tokenizer

    tok = tiny_media_tokenizer()  # <x124> <x125> <x126> are special tokens
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'model' %}<x125>{% else %}<x124>{% endif %}"
                         "{{ m['content'] }}<x126>{% endfor %}{% if add_generation_prompt %}<x125>{% endif %}")
    collator = DiffusionGemmaDataCollator(tok, canvas_length=L)
    row = {"messages": [{"role": "user", "content": "hi<eos>"}, {"role": "model", "content": "<x125>ok"}]}
    out = collator.tokenize(row)
    text = lambda s: tok(s, add_special_tokens=False, split_special_tokens=True)["input_ids"]  # noqa: E731
    assert out["input_ids"] == [124] + text("hi<eos>") + [126, 125]
    assert out["labels"] == text("<x125>ok") + [126, 1]
    assert 1 not in out["input_ids"] and out["labels"].count(125) == 0


def test_special_token_text_in_a_message_the_template_rewrites_is_refused():
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | upper }}</{{ m['role'] }}>"
                         "{% endfor %}{% if add_generation_prompt %}<model>{% endif %}")
    collator = DiffusionGemmaDataCollator(tok, canvas_length=L)
    row = {"messages": [{"role": "user", "content": "x<eos>"}, {"role": "model", "content": "y"}]}
    with pytest.raises(RowError, match=r"messages\[0\] holds special-token text \('<eos>'\) and the chat template "
                                       r"does not copy"):
        collator.tokenize(row, where="line 4")
