"""`pipeline("text-generation")` with our model: from a path or an instance, chat messages, return_full_text."""

import logging

import pytest
import torch
from transformers import pipeline

from conftest import tiny_tokenizer
from diffusiongemma import DiffusionGemmaForBlockDiffusion


@pytest.fixture(scope="module")
def generator(saved_pair):
    return pipeline("text-generation", model=str(saved_pair[0]))


def test_path_gives_our_model_without_unsupported_warning(saved_pair, caplog):
    with caplog.at_level(logging.ERROR):
        pipe = pipeline("text-generation", model=str(saved_pair[0]))
    assert type(pipe.model) is DiffusionGemmaForBlockDiffusion
    assert "not supported for text-generation" not in caplog.text


def test_text_is_generated_and_matches_generate(generator, saved_pair):
    _, _, ours = saved_pair
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    out = generator("hello", max_new_tokens=16, max_denoising_steps=3)
    torch.manual_seed(0)
    ids = tok("hello", return_tensors="pt")["input_ids"]
    direct = ours.generate(ids, max_new_tokens=16, max_denoising_steps=3, pad_token_id=tok.pad_token_id)
    expected = tok.decode(direct.sequences[0], skip_special_tokens=True)
    assert out[0]["generated_text"] == expected
    assert out[0]["generated_text"].startswith("hello")


def test_return_full_text_false_drops_the_prompt(generator):
    torch.manual_seed(1)
    full = generator("abc", max_new_tokens=16, max_denoising_steps=2)[0]["generated_text"]
    torch.manual_seed(1)
    new = generator("abc", max_new_tokens=16, max_denoising_steps=2, return_full_text=False)[0]["generated_text"]
    assert full == "abc" + new


def test_instance_and_chat_messages(saved_pair):
    path, _, ours = saved_pair
    pipe = pipeline("text-generation", model=ours, tokenizer=tiny_tokenizer())
    out = pipe([{"role": "user", "content": "hi"}], max_new_tokens=16, max_denoising_steps=2)
    messages = out[0]["generated_text"]
    assert messages[0] == {"role": "user", "content": "hi"}
    assert messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str)


def test_greedy_request_is_rejected(generator):
    with pytest.raises(ValueError, match="do_sample"):
        generator("hello", max_new_tokens=16, do_sample=False)


def test_constraint_passes_through(generator):
    import diffusiongemma

    out = generator(["abc", "de"], constraint=diffusiongemma.Regex("[0-9]{5}"), tokenizer=generator.tokenizer,
                    max_new_tokens=16, max_denoising_steps=2, return_full_text=False)
    for item in out:
        assert len(item) == 1 and item[0]["generated_text"].isdigit() and len(item[0]["generated_text"]) == 5
        assert item[0]["truncated"] is False  # the output's per-row flag reaches the pipeline's answer
