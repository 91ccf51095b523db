"""The lm-eval model "diffusiongemma" (evaluation/adapter.py, stops.py) on a tiny checkpoint: registration, stop
strings (early and after the fact), max_gen_toks, chat templates, loglikelihood and rolling windows through the ELBO,
PEFT adapters, quantized folders, and bad arguments."""

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from diffusiongemma.evaluation import DiffusionGemmaLM, continuation_loglikelihood  # noqa: E402
from diffusiongemma.evaluation.stops import StopStringsInCanvas, cut_at_stop_strings  # noqa: E402
from conftest import tiny_config, tiny_model, tiny_tokenizer  # noqa: E402

L = 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_model(tiny_config(canvas_length=L, num_hidden_layers=2,
                           layer_types=["sliding_attention", "full_attention"])).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lm(folder):
    return DiffusionGemmaLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=4, seed=5,
                            mc_samples=3, max_denoising_steps=4)


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def generate(lm, contexts, **gen_kwargs) -> list[str]:
    return lm.generate_until([request("generate_until", c, gen_kwargs) for c in contexts], disable_tqdm=True)


def test_registered_under_its_name():
    assert get_model("diffusiongemma") is DiffusionGemmaLM


def test_stop_strings_cut_at_the_first_one_and_max_gen_toks_holds(lm, monkeypatch):
    contexts = ["Hello there", "abc", "The sky is"]
    free = generate(lm, contexts, until=[], max_gen_toks=3 * L)
    assert max(len(a) for a in free) > L  # several canvases of text (one token per character)
    i = max(range(3), key=lambda k: len(free[k]))
    stop = free[i][2:4]
    cut = generate(lm, contexts, until=[stop], max_gen_toks=3 * L)  # same seed: the same canvases
    for a, b in zip(free, cut):
        assert b == (a[: a.find(stop)] if stop in a else a)
    assert cut[i] == free[i][: free[i].find(stop)]
    decoded, decode = [], lm.tokenizer.decode
    monkeypatch.setattr(lm.tokenizer, "decode", lambda ids, **kw: (decoded.append(len(ids)), decode(ids, **kw))[1])
    generate(lm, contexts, until=[], max_gen_toks=5)
    assert len(decoded) == 3 and max(decoded) <= 5  # a whole canvas (8) was generated, 5 tokens kept


def test_a_stop_string_in_the_first_canvas_stops_generation_early(lm):
    lm.generation_passes.clear()
    free = generate(lm, ["Hello there"], until=[], max_gen_toks=3 * L)[0]
    free_passes = lm.generation_passes[-1]
    if len(free) <= L:
        pytest.skip("this seed's answer ended in its first canvas")
    stopped = generate(lm, ["Hello there"], until=[free[1]], max_gen_toks=3 * L)[0]
    assert stopped == free[: free.find(free[1])]
    assert lm.generation_passes[-1] < free_passes  # the later canvases were never denoised


def test_stop_criterion_reads_the_last_canvas_only():
    tok = tiny_tokenizer()
    rows = torch.tensor([tok.encode("xxxxSTOPaaaaaaaa"), tok.encode("xxxxaaaaaaaaSTOP"), tok.encode("STOPxxxxaaaaaaaa")])
    flags = StopStringsInCanvas(tok, ["STOP", ""])(rows, None, new_token_length=8)
    assert flags.tolist() == [False, True, False]
    assert cut_at_stop_strings("a\n\nb.c", ["c", "\n\n", ""]) == "a"
    assert cut_at_stop_strings("abc", ["z"]) == "abc"


def test_chat_template(lm):
    text = lm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<user>hi</user><model>"
    assert lm.chat_template(True) == lm.tokenizer.chat_template and lm.chat_template(False) is None
    assert generate(lm, [text], until=[], max_gen_toks=L)[0] is not None


def test_loglikelihood_is_the_elbo_estimate(lm):
    (ll, greedy), = lm.loglikelihood([request("loglikelihood", "Hello", " world")], disable_tqdm=True)
    ctx, cont = lm.tok_encode("Hello"), lm.tok_encode(" world")
    est = continuation_loglikelihood(lm.model, ctx, cont, samples=3, seed=5)
    assert ll == pytest.approx(est.loglikelihood) and greedy == est.is_greedy
    assert lm.elbo_standard_errors[-1] == pytest.approx(est.standard_error)


def test_rolling_scores_every_token_once(folder):
    lm = DiffusionGemmaLM(pretrained=str(folder), dtype="float32", device="cpu", seed=1, mc_samples=2,
                          max_length=L + 6)  # windows of 6 tokens
    text = "a rolling text of 27 chars."
    seen = []
    real = lm._score
    lm._score = lambda context, continuation: (seen.append((context, continuation)), real(context, continuation))[1]
    (total,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", text)], disable_tqdm=True)
    assert [t for _, cont in seen for t in cont] == lm.tok_encode(text, add_special_tokens=False)
    assert len(seen) == 5 and all(len(c) <= 6 for _, c in seen) and seen[0][0] == [lm.prefix_token_id]
    assert total == pytest.approx(sum(continuation_loglikelihood(lm.model, c, x, 2, 1).loglikelihood
                                      for c, x in seen))


def test_peft_adapter_is_merged(folder, tmp_path):
    from peft import LoraConfig, get_peft_model

    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    peft_model = get_peft_model(DiffusionGemmaForBlockDiffusion.from_pretrained(folder),
                                LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)  # a trained-looking adapter (B starts at zero)
    peft_model.save_pretrained(tmp_path / "adapter")
    merged = peft_model.merge_and_unload()
    lm = DiffusionGemmaLM(pretrained=str(folder), peft=str(tmp_path / "adapter"), dtype="float32",
                          device_map="cpu")
    ours, theirs = dict(lm.model.named_parameters()), dict(merged.named_parameters())
    name = next(n for n in theirs if n.endswith("q_proj.weight"))
    assert torch.equal(ours[name], theirs[name])
    base = DiffusionGemmaForBlockDiffusion.from_pretrained(folder)
    assert not torch.equal(dict(base.named_parameters())[name], ours[name])


def test_quantized_folder_loads_compressed(tmp_path):
    from quantization.ct_checkpoint import REGEX_IGNORE, write_compressed_checkpoint

    base = tiny_model(tiny_config(canvas_length=L, num_hidden_layers=2,
                                  layer_types=["sliding_attention", "full_attention"]))
    write_compressed_checkpoint(base, tmp_path, "FP8_DYNAMIC", REGEX_IGNORE)
    tiny_tokenizer().save_pretrained(tmp_path)
    lm = DiffusionGemmaLM(pretrained=str(tmp_path), device="cpu", mc_samples=2)
    assert any("weight_scale" in n for n, _ in lm.model.named_parameters())
    assert len(generate(lm, ["abc"], until=[], max_gen_toks=L)) == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size="auto"), "batch_size"),
    (dict(mc_samples=0), "mc_samples"),
    (dict(seed=-1), "seed"),
    (dict(sampler_preset="nope"), "sampler_preset"),
])
def test_bad_model_args_name_themselves(folder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DiffusionGemmaLM(pretrained=str(folder), device="cpu", **kwargs)


def test_bad_requests_name_the_field(lm):
    with pytest.raises(ValueError, match="top_q"):
        generate(lm, ["abc"], until=[], top_q=3)
    with pytest.raises(ValueError, match="until"):
        generate(lm, ["abc"], until=[3])
    with pytest.raises(ValueError, match="max_length"):
        lm.loglikelihood([request("loglikelihood", "a" * 1100, "b")], disable_tqdm=True)
