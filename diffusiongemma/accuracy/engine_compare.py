"""`diffusiongemma compare --engine-url URL`: is a running OpenAI-compatible server serving this model?
(docs/reference-accuracy.md, "Checking a running server").

Every prompt goes to the server N times (completions, or chat completions with `--chat`), and the reference (the
model at `--model`) generates N answers to it with the same settings. Every answer, the engine's and the
reference's alike, is then scored under the reference as a minimal trace: the prompt and the answer's canvases
encoded, each canvas fed back to the decoder (no self-conditioning, T = 1), and per answer the mean log-probability
of its tokens and the share of them that are the decoder's argmax (a denoising fixed point).

The verdict compares the two mean log-probabilities, stratified by prompt: d = mean over prompts of (engine mean -
reference mean), with standard error from the per-prompt sample variances and Welch degrees of freedom
(`stats.py`). The engine fails (exit 1) when it is significantly worse by more than a rounding-sized margin: a
non-inferiority test of H0 "true d >= -MARGIN", one-sided p = P(T_df <= (d + MARGIN) / SE) below ALPHA. An
agreeing engine (true d = 0) then fails with probability well below ALPHA per run, including on models whose
answers are all fixed points, where SE is near zero and the plain t = d / SE of a 5e-5-nat difference is -25
(measured over repeated agreeing runs: benchmarks/engine_compare_calibration.py).
Exit 2: the server is unreachable, refuses a request, or answers with something that is not an answer (named).

Legend: P prompt length, L canvas length, C canvases of an answer, V vocab.
"""

import json
import math
import sys
from dataclasses import asdict, dataclass, field

import torch

from .engine_client import Answer, EngineError, declared_window, engine_answers
from .engine_logprobs import compare_reported, ids_of_tokens
from .stats import stratified_test, t_cdf

ALPHA = 0.001  # one-sided false-alarm probability of the t-test for an agreeing engine
MARGIN = 0.02  # nats per token: differences below this are rounding (bf16 engines), never a failure


@dataclass
class AnswerScore:
    """One answer scored under the reference: tokens scored (its tokens, plus EOS when it stopped), canvases, mean
    log-probability of the scored tokens, and the share that are the argmax of their canvas."""

    prompt: int
    sample: int
    tokens: int
    canvases: int
    mean_logprob: float
    argmax_agree: float
    token_logprobs: list[float] = field(default_factory=list, repr=False)  # per scored token (not in the JSON)


def add_engine_arguments(p) -> None:
    """The `--engine-url` mode's options of `compare`."""
    p.add_argument("--engine-url", default=None,
                   help="check a running OpenAI-compatible server instead of a trace: its /v1 base URL, e.g. "
                        "http://127.0.0.1:8000/v1 (needs --prompts; exit 1 when its answers are significantly less "
                        "likely under the reference, 2 when it cannot be asked)")
    p.add_argument("--prompts", default=None, help="--engine-url: prompts file, one per line (or .jsonl `prompt`)")
    p.add_argument("--chat", action="store_true", help="--engine-url: ask /chat/completions (one user message)")
    p.add_argument("--samples", type=int, default=4, help="--engine-url: answers per prompt and side (default 4)")
    p.add_argument("--max-tokens", type=int, default=32, help="--engine-url: max_tokens per answer (default 32)")
    p.add_argument("--api-key", default=None, help="--engine-url: bearer token for the server")
    p.add_argument("--seed", type=int, default=0, help="--engine-url: seed of sample s is seed + s (default 0)")
    p.add_argument("--served-model", default=None, help="--engine-url: model name to request (default: the first "
                                                        "of the server's /models)")
    p.add_argument("--logprobs", action="store_true",
                   help="--engine-url: ask for the log-probability of every generated token (completions "
                        "logprobs: 1, chat logprobs: true); the tokens then name the answer's ids and the values are "
                        "set beside the reference's (our own serve refuses it: 400)")


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """The prompt's ids as a server builds them: the chat template with the generation prompt, or the text."""
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(prompt)["input_ids"]


def eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos if isinstance(eos, list) else [eos])


@torch.no_grad()
def reference_answers(model, tokenizer, prompts: list[list[int]], samples: int, max_tokens: int,
                      seed: int) -> list[Answer]:
    """`samples` answers per prompt (its ids, `prompt_ids`) from the reference (its generation config,
    `max_new_tokens = max_tokens`, sample s after `torch.manual_seed(seed + s)`), cut at the first EOS and at
    max_tokens, decoded like a server."""
    device = next(model.parameters()).device
    eos = eos_ids(model)
    answers = []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt], device=device)
        for s in range(samples):
            torch.manual_seed(seed + s)
            out = model.generate(ids, max_new_tokens=max_tokens, return_dict_in_generate=True)
            new = out.sequences[0, ids.shape[1]:].tolist()[:max_tokens]
            stop = next((j for j, t in enumerate(new) if t in eos), None)
            new, reason = (new, "length") if stop is None else (new[:stop], "stop")
            answers.append(Answer(i, s, tokenizer.decode(new, skip_special_tokens=True), new, reason))
    return answers


def answer_tokens(tokenizer, answer: Answer, use_ids: bool) -> list[int]:
    """The answer's ids: the returned ones, or its text tokenized again (the same for both sides)."""
    if use_ids and answer.token_ids is not None:
        return list(answer.token_ids)
    return tokenizer(answer.text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def score_answer(model, prompt: list[int], ids: list[int], stopped: bool, answer: Answer) -> AnswerScore:
    """Score one answer as a minimal trace: prompt + answer (+ EOS when it stopped), padded to whole canvases, each
    canvas fed back to the decoder after the ones before it are encoded."""
    from .format import FORMAT_NAME, FORMAT_VERSION, Trace
    from .replay import PrefixEncoder, step_logprobs

    device = next(model.parameters()).device
    L = model.canvas_length
    eos = sorted(eos_ids(model))
    ids = [t for t in ids if t not in eos]  # a returned EOS is counted once, below
    tokens = ids + ([eos[0]] if stopped and eos else [])
    if not tokens:
        return AnswerScore(answer.prompt, answer.sample, 0, 0, math.nan, math.nan)
    canvases = -(-len(tokens) // L)
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    body = tokens + [pad] * (canvases * L - len(tokens))
    sequences = torch.tensor([prompt + body], dtype=torch.int32)
    trace = Trace({"format": FORMAT_NAME, "version": FORMAT_VERSION, "prompt_length": len(prompt),
                   "canvas_length": L}, {"sequences": sequences})
    prefix = PrefixEncoder(model, trace, device)
    logprob, agree = [], []
    for c in range(canvases):
        canvas = trace.committed(c).to(device=device, dtype=torch.long)  # [1, L]
        ours = step_logprobs(model, canvas, prefix.ready_for(c), None, None, 1.0)[0]  # [L, V]
        n = min(L, len(tokens) - c * L)
        logprob.append(ours[:n].gather(-1, canvas[0, :n, None])[:, 0].double())
        agree.append((ours[:n].argmax(dim=-1) == canvas[0, :n]).double())
    logprob, agree = torch.cat(logprob), torch.cat(agree)
    return AnswerScore(answer.prompt, answer.sample, len(tokens), canvases, float(logprob.mean()),
                       float(agree.mean()), logprob.tolist())


def stratified_difference(engine: list[AnswerScore], reference: list[AnswerScore], field: str) -> dict:
    """`stats.stratified_test` of `field` grouped by prompt (NaN scores, i.e. empty answers, left out)."""
    def values(scores, p):
        return [getattr(s, field) for s in scores if s.prompt == p and not math.isnan(getattr(s, field))]

    prompts = sorted({s.prompt for s in engine} & {s.prompt for s in reference})
    return stratified_test([(values(engine, p), values(reference, p)) for p in prompts])


def side_summary(scores: list[AnswerScore]) -> dict:
    def mean(field):
        xs = [getattr(s, field) for s in scores if not math.isnan(getattr(s, field))]
        return sum(xs) / len(xs) if xs else None

    return {"answers": len(scores), "scored": sum(not math.isnan(s.mean_logprob) for s in scores),
            "mean_logprob": mean("mean_logprob"), "argmax_agree": mean("argmax_agree"),
            "mean_tokens": sum(s.tokens for s in scores) / len(scores) if scores else None}


def margin_p_value(logprob: dict, margin: float = MARGIN) -> float | None:
    """One-sided p-value of "the engine is at most `margin` nats per token worse" (H0: true d >= -margin), from the
    stratified difference's d, SE and df: P(T_df <= (d + margin) / SE). None without a difference."""
    d, se = logprob["difference"], logprob["se"]
    if d is None:
        return None
    if not se:  # no variance anywhere: decided by d alone
        return 0.0 if d < -margin else 1.0
    return t_cdf((d + margin) / se, logprob["df"])


def verdict(logprob: dict) -> bool:
    """True (pass) unless the engine is significantly worse than the reference by more than MARGIN: the
    non-inferiority p-value `margin_p_value` is below ALPHA (which also needs d < -MARGIN)."""
    p = margin_p_value(logprob)
    return p is not None and p >= ALPHA


def name_ids_from_logprobs(tokenizer, answers: list[Answer]) -> None:
    """Answers without `token_ids` whose reported logprobs tokens name their ids for sure get those ids."""
    for a in answers:
        if a.token_ids is None and a.logprobs is not None:
            ids = ids_of_tokens(tokenizer, a.logprobs.tokens, a.text)
            if ids is not None:
                a.token_ids, a.ids_from = ids, "logprobs"


def compare_engine(model, tokenizer, base: str, prompts: list[str], samples: int, max_tokens: int, chat: bool,
                   api_key: str | None, seed: int, model_name: str | None = None, logprobs: bool = False) -> dict:
    """Ask the server, generate with the reference, score both under the reference -> the summary (JSON-able)."""
    base = base.rstrip("/")
    name, window = declared_window(base, model_name, api_key)
    engine = engine_answers(base, name, prompts, samples, max_tokens, chat, api_key, seed, logprobs)
    name_ids_from_logprobs(tokenizer, engine)
    use_ids = all(a.token_ids is not None for a in engine)
    prompt_tokens = [prompt_ids(tokenizer, prompt, chat) for prompt in prompts]  # as the server builds them
    reference = reference_answers(model, tokenizer, prompt_tokens, samples, max_tokens, seed)
    # with ids returned: how many answers' text does not tokenize back into them (a detokenizer or template issue)
    eos = eos_ids(model)
    mismatched = [a.prompt * samples + a.sample for a in engine if use_ids
                  and tokenizer(a.text, add_special_tokens=False)["input_ids"] != [t for t in a.token_ids
                                                                                 if t not in eos]]
    scored = {}
    for side, answers in (("engine", engine), ("reference", reference)):
        scored[side] = [score_answer(model, prompt_tokens[a.prompt], answer_tokens(tokenizer, a, use_ids),
                                     a.finish_reason == "stop", a) for a in answers]
    logprob = stratified_difference(scored["engine"], scored["reference"], "mean_logprob")
    logprob["p_beyond_margin"] = margin_p_value(logprob)
    top1 = stratified_difference(scored["engine"], scored["reference"], "argmax_agree")
    reported = compare_reported([(a.logprobs.logprobs, s.token_logprobs) for a, s in zip(engine, scored["engine"])
                                 if a.logprobs is not None and use_ids])
    sources = sorted({a.ids_from for a in engine}) if use_ids else ["text"]
    return {
        "mode": "engine", "engine_url": base, "served_model": name, "chat": chat, "prompts": len(prompts),
        "samples": samples, "max_tokens": max_tokens, "tokens_from": "+".join(sources),
        "decoder_window": {"engine": window, "reference": model.get_decoder().decoder_window},
        "reported_logprobs": reported,
        "text_id_mismatches": mismatched,
        "engine": side_summary(scored["engine"]), "reference": side_summary(scored["reference"]),
        "logprob_difference": logprob, "argmax_difference": top1,
        "test": {"alpha": ALPHA, "margin": MARGIN, "kind": "stratified Welch t, one-sided, non-inferiority by the margin"},
        "passed": verdict(logprob),
        "answers": {side: [{k: v for k, v in asdict(s).items() if k != "token_logprobs"} for s in scores]
                    for side, scores in scored.items()},
        "texts": {"engine": [a.text for a in engine], "reference": [a.text for a in reference]},
    }


def _f(x, digits=4) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _p(x) -> str:
    return "-" if x is None else f"{x:.2g}"


def format_engine_table(summary: dict) -> str:
    e, r, d, t = summary["engine"], summary["reference"], summary["logprob_difference"], summary["argmax_difference"]
    lines = [f"engine {summary['engine_url']} (model {summary['served_model']}), {summary['prompts']} prompt(s) x "
             f"{summary['samples']} sample(s), max_tokens {summary['max_tokens']}, "
             f"{'chat' if summary['chat'] else 'completions'}, tokens from {summary['tokens_from']}",
             "side        answers  mean-logprob  argmax-agree  mean-tokens",
             f"engine      {e['answers']:>7}  {_f(e['mean_logprob']):>12}  {_f(e['argmax_agree']):>12}  "
             f"{_f(e['mean_tokens'], 1):>11}",
             f"reference   {r['answers']:>7}  {_f(r['mean_logprob']):>12}  {_f(r['argmax_agree']):>12}  "
             f"{_f(r['mean_tokens'], 1):>11}"]
    windows = summary["decoder_window"]
    if windows["engine"] is not None and windows["engine"] != windows["reference"]:
        lines.append(f"note: the server declares decoder_window {windows['engine']!r} (a semantics switch, "
                     f"docs/reference-accuracy.md); the reference runs {windows['reference']!r} "
                     f"(compare --decoder-window {windows['engine']} judges it under the same switch)")
    if summary["reported_logprobs"] is not None:
        r = summary["reported_logprobs"]
        lines.append(f"reported logprobs ({r['tokens']} tokens of {r['answers']} answers): mean "
                     f"{r['mean_reported']:.4f}"
                     f" vs the reference's {r['mean_reference']:.4f} for the same tokens, mean |difference| "
                     f"{r['mean_abs_difference']:.4f}, max {r['max_abs_difference']:.4f} (compared, not judged)")
    if summary["text_id_mismatches"]:
        lines.append(f"note: {len(summary['text_id_mismatches'])} answer(s) whose text does not tokenize back into "
                     f"the returned token_ids (answers {summary['text_id_mismatches'][:8]})")
    if d["difference"] is not None:
        lines.append(f"engine - reference, mean log-prob per token: {d['difference']:+.4f} nats, 95% CI "
                     f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}], t {_f(d['t'], 2)}, df {_f(d['df'], 1)}, "
                     f"p {_p(d['p_value'])}; p of more than {MARGIN} nats worse {_p(d['p_beyond_margin'])}")
        lines.append(f"engine - reference, argmax agreement: {t['difference']:+.4f}, 95% CI "
                     f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]")
    if summary["passed"]:
        lines.append(f"PASS: the engine's answers are not significantly less likely under the reference "
                     f"(fails when more than {MARGIN} nats per token worse with one-sided p < {ALPHA})")
    else:
        lines.append(f"FAIL: the engine's answers are significantly less likely under the reference "
                     f"(more than {MARGIN} nats per token worse, one-sided p < {ALPHA})")
    return "\n".join(lines)


def run_engine_compare(args, load) -> int:
    """The `compare --engine-url` command; `load(args)` -> (model, tokenizer). Exit 0 / 1 / 2."""
    from .cli import read_prompts

    for name, value in (("--samples", args.samples), ("--max-tokens", args.max_tokens)):
        if value < 1:
            print(f"error: {name} must be a positive integer, got {value}", file=sys.stderr)
            return 2
    if args.prompts is None:
        print("error: compare --engine-url needs --prompts FILE", file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args.prompts)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read prompts from {args.prompts}: {e}", file=sys.stderr)
        return 2
    if not prompts:
        print(f"error: {args.prompts} holds no prompts", file=sys.stderr)
        return 2
    if args.trace is not None:
        print("error: give --trace (a recorded trace) or --engine-url (a running server), not both", file=sys.stderr)
        return 2
    model, tokenizer = load(args)
    try:
        summary = compare_engine(model, tokenizer, args.engine_url, prompts, args.samples, args.max_tokens,
                                 args.chat, args.api_key, args.seed, args.served_model, args.logprobs)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else format_engine_table(summary))
    return 0 if summary["passed"] else 1
