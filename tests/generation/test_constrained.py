"""Constrained `generate`: a tiny RANDOM model (the hardest case: only the constraint makes an answer valid) gives
100% valid answers for several regexes and JSON schemas over many seeds, in reference and fast mode, lock-step,
mixed and chunked; answers span several canvases (the state carries across them); `truncated` flags a budget that
ran out; the errors name their cause."""

import json
import re

import jsonschema
import pytest
import torch

from conftest import tiny_model, tiny_tokenizer

import diffusiongemma
from diffusiongemma import ConstraintError, JsonSchema, Regex

pytestmark = pytest.mark.usefixtures("one_thread")
TOK = tiny_tokenizer()
KW = dict(max_denoising_steps=4, eos_token_id=1, pad_token_id=0)
REGEXES = [r"[0-9]{3}-[a-z]+", r"(yes|no)( because [a-z ]{5,20})?\.", r"\(([0-9]+,)*[0-9]+\)"]
SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "fish"]}, "age": {"type": "number"}},
                "required": ["kind", "age"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
     "required": ["name", "pet", "tags"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4},
    {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]}]},
]
MODES = [dict(sampling="reference"), dict(sampling="fast", batching="lockstep"),
         dict(sampling="fast", batching="mixed", max_batch_size=3)]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def answers(out, prompt_width: int) -> list[str]:
    return [TOK.decode(row[prompt_width:], skip_special_tokens=True) for row in out.sequences]


def prompts(n: int, seed: int) -> torch.Tensor:
    return torch.randint(4, 100, (n, 5), generator=torch.Generator().manual_seed(seed))


def run(model, constraint, mode, seed, rows=6, max_new_tokens=48):
    if mode["sampling"] == "reference":
        torch.manual_seed(seed)
        extra = {}
    else:
        extra = {"seed": seed}
    return model.generate(prompts(rows, seed), constraint=constraint, tokenizer=TOK, max_new_tokens=max_new_tokens,
                          **mode, **extra, **KW)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(str(v) for v in m.values()))
@pytest.mark.parametrize("pattern", REGEXES)
def test_every_answer_matches_the_regex(model, pattern, mode):
    for seed in (0, 1):
        out = run(model, Regex(pattern), mode, seed)
        for text in answers(out, 5):
            assert re.fullmatch(pattern, text), text
        assert not bool(out.truncated.any())


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(str(v) for v in m.values()))
@pytest.mark.parametrize("schema", SCHEMAS, ids=["nested", "array", "anyOf"])
def test_every_answer_validates_against_the_schema(model, schema, mode):
    for seed in (0, 1):
        out = run(model, JsonSchema(schema), mode, seed, max_new_tokens=80)
        for text in answers(out, 5):
            jsonschema.validate(json.loads(text), schema)
        assert not bool(out.truncated.any())


def test_answers_span_canvases(model):
    # 16-token canvases; the nested schema's answers are longer than one, so the state carried over a commit
    out = run(model, JsonSchema(SCHEMAS[0]), MODES[2], 3, rows=4, max_new_tokens=80)
    lengths = [len(TOK(text)["input_ids"]) for text in answers(out, 5)]
    assert max(lengths) > 16


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(str(v) for v in m.values()))
def test_answer_ends_within_max_new_tokens(model, mode):
    # 20 new tokens = two 16-token canvases: the answer ends by token 20, padding after it
    out = run(model, Regex(r"[a-z]{3,40}"), mode, 0, rows=3, max_new_tokens=20)
    new = out.sequences[:, 5:]
    assert new.shape[1] == 32 and bool((new[:, 20:] == 0).all())
    assert not bool(out.truncated.any())
    assert all(re.fullmatch(r"[a-z]{3,40}", t) for t in answers(out, 5))


def test_gumbel_sampler(model):
    torch.manual_seed(0)
    out = model.generate(prompts(3, 0), constraint=Regex(REGEXES[1]), tokenizer=TOK, max_new_tokens=32,
                         sampling="gumbel", **KW)
    assert all(re.fullmatch(REGEXES[1], t) for t in answers(out, 5))


def test_lockstep_chunks(model):
    out = model.generate(prompts(5, 0), constraint=Regex(REGEXES[0]), tokenizer=TOK, max_new_tokens=32, seed=0,
                         sampling="fast", batching="lockstep", max_batch_size=2, **KW)
    assert all(re.fullmatch(REGEXES[0], t) for t in answers(out, 5))
    assert out.truncated.tolist() == [False] * 5


def test_a_padded_batch_with_a_processor(model):
    # left padding and a processor that forbids digit 7: the answers still match, without a 7 where avoidable
    class NoSeven:
        def __call__(self, input_ids, scores):
            scores[..., TOK.convert_tokens_to_ids("7")] = float("-inf")
            return scores

    ids = prompts(3, 2)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    out = model.generate(ids, attention_mask=mask, constraint=Regex(r"[0-9]{4}"), tokenizer=TOK, max_new_tokens=16,
                         logits_processor=[NoSeven()], seed=0, sampling="fast", **KW)
    texts = answers(out, 5)
    assert all(re.fullmatch(r"[0-9]{4}", t) and "7" not in t for t in texts), texts


def test_truncated_when_the_budget_runs_out(model, caplog):
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 100}}, "required": ["a"]}
    for mode in MODES:
        out = run(model, JsonSchema(schema), mode, 0, rows=3, max_new_tokens=16)
        assert out.truncated.tolist() == [True] * 3
        for text in answers(out, 5):
            assert text.startswith('{') and not text.endswith("}")  # a valid prefix, never a whole answer
    assert "max_new_tokens ran out" in caplog.text and "rows [0, 1, 2]" in caplog.text


def test_plain_output_still_warns(model, caplog):
    out = model.generate(prompts(1, 0), constraint=Regex("[a-z]{40}"), tokenizer=TOK, max_new_tokens=16,
                         return_dict_in_generate=False, **KW)
    assert isinstance(out, torch.Tensor) and "max_new_tokens ran out" in caplog.text


def test_errors(model):
    ids = prompts(1, 0)
    with pytest.raises(ConstraintError, match="pass `tokenizer=`"):
        model.generate(ids, constraint=Regex("a+"), max_new_tokens=16, **KW)
    with pytest.raises(TypeError, match="`constraint` must be"):
        model.generate(ids, constraint="a+", tokenizer=TOK, max_new_tokens=16, **KW)
    no_pad = tiny_tokenizer()
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="needs a `pad_token_id`"):
        model.generate(ids, constraint=Regex("a+"), tokenizer=no_pad, max_new_tokens=16, max_denoising_steps=2,
                       pad_token_id=None)
    # the tokenizer's pad id stands in for a generation config without one
    out = model.generate(ids, constraint=Regex("a{3}"), tokenizer=TOK, max_new_tokens=16, max_denoising_steps=2,
                         pad_token_id=None, eos_token_id=1)
    assert answers(out, 5) == ["aaa"]
    with pytest.raises(ConstraintError, match="unsupported keyword 'uniqueItems'"):
        model.generate(ids, constraint=JsonSchema({"type": "array", "uniqueItems": True}), tokenizer=TOK, **KW)
    with pytest.raises(ConstraintError, match="cannot spell"):
        model.generate(ids, constraint=Regex("ü"), tokenizer=TOK, max_new_tokens=16, **KW)


def test_public_names():
    assert diffusiongemma.Regex is Regex and diffusiongemma.JsonSchema is JsonSchema


def test_byte_level_bpe_tokenizer_with_multibyte_characters():
    # a GPT-2 style tokenizer, trained here: tokens are byte sequences, é is two bytes and may be split across tokens
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from conftest import tiny_config

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["café crème brûlée, déjà vu, naïve résumé"] * 50, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    model = tiny_model(tiny_config(vocab_size=512))  # rows beyond the tokenizer's ~300 ids are never allowed
    for pattern in (r"(café|crème|déjà) [a-zé]{3,10}", r"[éèà]{2,6}!"):
        out = model.generate(torch.tensor([[5, 6, 7]]), constraint=Regex(pattern), tokenizer=tok, max_new_tokens=32,
                             sampling="fast", seed=0, **KW)
        assert re.fullmatch(pattern, tok.decode(out.sequences[0, 3:], skip_special_tokens=True))
        assert bool((out.sequences[0, 3:] < len(tok)).all())


@pytest.mark.parametrize("config", ["BlockRefinementSamplerConfig", "ConfidenceThresholdSamplerConfig",
                                    "DiscreteDDIMSamplerConfig"])
@pytest.mark.parametrize("sampling", ["fast", "reference"])
def test_every_registered_sampler(model, config, sampling):
    torch.manual_seed(0)
    seeded = {"seed": 0} if sampling == "fast" else {}
    out = model.generate(prompts(3, 1), constraint=JsonSchema(SCHEMAS[1]), tokenizer=TOK, max_new_tokens=48,
                         sampler_config=getattr(diffusiongemma, config)(), sampling=sampling, **seeded, **KW)
    for text in answers(out, 5):
        jsonschema.validate(json.loads(text), SCHEMAS[1])
