"""The mutation suite (issue 37): a foreign engine loop, written here from docs/trace-format.md and the spec (not from
our `generate`), runs transformers' built-in class on the bundled Sudoku model and writes traces; each planted bug of
a class engines have shipped must fail `compare` at default flags, naming the check that catches it, and the clean
loop must pass. docs/reference-accuracy.md holds the resulting catch table."""

import copy
import json
import random

import pytest
import torch
import transformers
from transformers import DynamicCache

from diffusiongemma.accuracy.format import Trace
from diffusiongemma.cli import main
from diffusiongemma.sudoku import make_puzzle
from diffusiongemma.sudoku.demo import DEMO_MODEL
from diffusiongemma.sudoku.tokenizer import sudoku_tokenizer, encode_puzzle

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "model.safetensors").exists(), reason="no bundled model")

N, T_MIN, T_MAX, BOUND, STABILITY, CONFIDENCE, K = 6, 0.8, 1.2, 0.1, 1, 0.02, 4
CANVASES = 2  # the second canvas reads a committed canvas from the cache (the RoPE-offset bug needs one)


@pytest.fixture(scope="module")
def builtin():
    return transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    rng, tokenizer = random.Random(3), sudoku_tokenizer()
    return torch.tensor([encode_puzzle(tokenizer, make_puzzle(rng, 45)[0]) for _ in range(2)])


def accept_by_entropy(entropy, bound):
    """Spec D.4f: sort ascending; keep a position while the entropies ranked strictly before it sum to <= bound."""
    ranked, order = entropy.sort(dim=-1)
    keep = (ranked.cumsum(dim=-1) - ranked) <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def entropy_of(logits):
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@torch.no_grad()
def foreign_trace(model, ids, bug=None) -> Trace:
    """One lock-step run of the entropy-bound algorithm with `bug` planted (None: clean), as a trace."""
    gen = torch.Generator().manual_seed(0)
    B, P = ids.shape
    L, V = model.config.canvas_length, model.config.text_config.vocab_size
    emb = model.model.decoder.embed_tokens
    text_config = model.config.text_config
    if bug == "window_w":  # the cache keeps W cached tokens for the sliding layers instead of W - 1
        text_config = copy.deepcopy(text_config)
        text_config.sliding_window += 1
    cache, sequences, rec = DynamicCache(config=text_config), ids.clone(), {}
    model.model.encoder(input_ids=ids, past_key_values=cache, position_ids=torch.arange(P)[None])

    def add(**tensors):
        for name, value in tensors.items():
            rec.setdefault(name, []).append(value)

    for c in range(CANVASES):
        start = P + c * L
        canvas = torch.randint(0, V, (B, L), generator=gen)
        sc_logits = torch.zeros(B, L, V) if bug == "sc_off_nonzero" else None  # "off" must be no input at all
        sc_top = (torch.zeros(B, L, K, dtype=torch.int32), torch.zeros(B, L, K))
        stopped = torch.zeros(B, dtype=torch.bool)
        prev_argmax, argmax_final = None, torch.zeros(B, L, dtype=torch.long)
        for step in range(N):
            n = N - step
            T = T_MIN + (T_MAX - T_MIN) * ((N - n) if bug == "temperature_reversed" else n) / N
            active = ~stopped
            logits = model(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=sc_logits,
                           decoder_position_ids=torch.arange(start, start + L)[None]).logits.float()
            tempered = logits / T
            logp = torch.log_softmax(tempered, dim=-1)
            entropy = entropy_of(tempered)
            argmax = tempered.argmax(dim=-1)
            accepted = accept_by_entropy(entropy_of(logits) if bug == "accept_untempered" else entropy, BOUND)
            sample = torch.multinomial(logp.exp().view(-1, V), 1, generator=gen).view(B, L)
            soft = (torch.zeros(B, L, emb.weight.shape[1]) if sc_logits is None
                    else (sc_logits.softmax(-1) @ emb.weight) * emb.embed_scale)
            top_lp, top_ids = logp.topk(K, dim=-1)
            mean_entropy = entropy.mean(dim=-1)
            # S = 1: the argmax canvas equals the previous step's (the buggy engine ignores that history)
            stable = torch.zeros(B, dtype=torch.bool) if prev_argmax is None else (argmax == prev_argmax).all(dim=-1)
            if bug == "stop_early":
                stable = torch.ones(B, dtype=torch.bool)
            now_stopped = stopped | (active & stable & (mean_entropy < CONFIDENCE))
            add(canvas_index=torch.tensor([c], dtype=torch.int32), step_index=torch.tensor([step], dtype=torch.int32),
                steps_remaining=torch.tensor([n], dtype=torch.int32), temperature=torch.tensor([T]),
                active=active[None], input_canvas=canvas.int()[None], sc_present=torch.tensor([step > 0] * B)[None],
                sc_ids=sc_top[0][None], sc_logprobs=sc_top[1][None], sc_embedding=soft.float()[None],
                topk_ids=top_ids.int()[None], topk_logprobs=top_lp[None], argmax=argmax.int()[None],
                entropy=entropy[None], accepted=accepted[None], stopped=now_stopped[None])
            argmax_final = torch.where(active[:, None], argmax, argmax_final)
            # the next self-conditioning input: this step's tempered distribution, for rows still denoising
            source = tempered
            if bug == "sc_untempered":
                source = logits
            if bug == "sc_half_vocab":
                source = tempered.clone()
                source[..., V // 2:] = float("-inf")
            new_lp, new_ids = torch.log_softmax(source, dim=-1).topk(K, dim=-1)
            keep = active[:, None, None]
            sc_logits = source if sc_logits is None else torch.where(keep, source, sc_logits)
            sc_top = (torch.where(keep, new_ids.int(), sc_top[0]), torch.where(keep, new_lp, sc_top[1]))
            noise = torch.randint(0, V, (B, L), generator=gen)
            canvas = torch.where(active[:, None], torch.where(accepted, sample, noise), canvas)
            prev_argmax, stopped = argmax, now_stopped
            if bool(stopped.all()):
                break
        committed = torch.roll(argmax_final, 1, dims=1) if bug == "commit_shifted" else argmax_final
        sequences = torch.cat([sequences, committed], dim=1)
        offset = 1 if bug == "commit_rope_offset" else 0
        model.model.encoder(input_ids=committed, past_key_values=cache,
                            position_ids=torch.arange(start + offset, start + offset + L)[None])
    tensors = {name: torch.cat(parts) for name, parts in rec.items()}
    tensors["sequences"] = sequences.int()
    settings = {"max_denoising_steps": N, "t_min": T_MIN, "t_max": T_MAX, "stability_threshold": STABILITY,
                "confidence_threshold": CONFIDENCE, "eos_token_id": None, "pad_token_id": None,
                "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": BOUND}}
    manifest = {"format": "diffusiongemma-trace", "version": 1, "prompt_length": P, "canvas_length": L,
                "vocab_size": V, "sampling": "foreign-loop", "top_k": K, "sc_embedding": True,
                "generation_config": settings}
    return Trace(manifest, tensors)


def perturbed(model):
    bad = type(model).from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    with torch.no_grad():
        w = bad.model.decoder.layers[1].self_attn.o_proj.weight
        w.add_(0.1 * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    return bad


def compare(trace, folder, capsys, model_folder=DEMO_MODEL):
    trace.save(folder)
    capsys.readouterr()
    code = main(["compare", "--model", str(model_folder), "--trace", str(folder), "--json"])
    return code, json.loads(capsys.readouterr().out)


CATCHES = {  # bug -> the check that must catch it
    "sc_off_nonzero": "self_conditioning",
    "stop_early": "stop",
    "commit_shifted": "commit",
    "temperature_reversed": "temperature",
    "accept_untempered": "acceptance",
    "sc_untempered": "self_conditioning",
    "sc_half_vocab": "self_conditioning",
    "commit_rope_offset": "model",
    "perturbed_weight": "model",
}


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """The Sudoku model with a sliding window of 64, so that it binds on the 83-token prompt already."""
    folder = tmp_path_factory.mktemp("windowed")
    model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    model.config.text_config.sliding_window = 64
    model.save_pretrained(folder)
    sudoku_tokenizer().save_pretrained(folder)
    return folder, type(model).from_pretrained(folder, dtype=torch.float32).eval()


def test_a_window_of_w_instead_of_w_minus_1_fails_compare_once_it_binds(windowed, prompts, tmp_path, capsys):
    folder, model = windowed
    code, summary = compare(foreign_trace(model, prompts), tmp_path / "clean", capsys, folder)
    assert code == 0, summary["failed_checks"]
    code, summary = compare(foreign_trace(model, prompts, "window_w"), tmp_path / "bug", capsys, folder)
    assert code == 1 and "model" in summary["failed_checks"]
    first = summary["checks"]["model"]["first"]
    print(f"CATCH window_w: {summary['failed_checks']} first model at canvas {first['canvas']} step {first['step']}")


def test_the_clean_foreign_loop_passes(builtin, prompts, tmp_path, capsys):
    code, summary = compare(foreign_trace(builtin, prompts), tmp_path / "clean", capsys)
    assert summary["failed_checks"] == [] and summary["skipped_checks"] == {} and code == 0
    assert summary["checks"]["stop"]["checked"] > 0


@pytest.mark.parametrize("bug", list(CATCHES))
def test_each_planted_bug_fails_compare(builtin, prompts, tmp_path, capsys, bug):
    model = perturbed(builtin) if bug == "perturbed_weight" else builtin
    code, summary = compare(foreign_trace(model, prompts, None if bug == "perturbed_weight" else bug),
                            tmp_path / bug, capsys)
    assert code == 1 and CATCHES[bug] in summary["failed_checks"], summary["failed_checks"]
    first = summary["checks"][CATCHES[bug]]["first"]
    print(f"CATCH {bug}: {summary['failed_checks']} first {CATCHES[bug]} at canvas {first['canvas']} step "
          f"{first['step']}")
