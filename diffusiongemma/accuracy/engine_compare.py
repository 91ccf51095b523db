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

A run that does not fail must also have had the power to fail: its minimum detectable difference (`detectable`,
the smallest true engine deficit the test finds with probability `--power`, 0.8 by default) is MARGIN +
(t_{1-ALPHA} + t_{power}) * SE at the run's df. Above `--max-detectable` (0.25 nats per token by default) the verdict
is "inconclusive" (exit 3), never a pass: more prompts or samples shrink SE.
Exit 2: the input is malformed (the URL, a prompt line, an option), the server is unreachable, refuses a request,
or answers with something that is not an answer (named: a missing field, token ids that are not ids of this
vocabulary, an empty answer that claims to have hit max_tokens, more tokens than max_tokens).

Legend: P prompt length, L canvas length, C canvases of an answer, V vocab.
"""

import json
import math
import sys
from dataclasses import asdict, dataclass, field

import torch

from ..cli_types import bounded_float
from .engine_client import REQUEST_TIMEOUT_S, Answer, EngineError, check_base_url, declared_window, engine_answers
from .engine_logprobs import compare_reported, ids_of_tokens
from .engine_table import format_engine_table
from .engine_verdict import (  # noqa: F401 -- ALPHA, MARGIN, margin_p_value, verdict: the verdict's public names
    ALPHA,
    MARGIN,
    MAX_DETECTABLE,
    POWER,
    detectable_difference,
    margin_p_value,
    side_summary,
    stratified_difference,
    verdict,
    verdict_of,
)

EXIT_INCONCLUSIVE = 3


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


_positive_float = bounded_float(0, low_open=True)
_probability = bounded_float(0.5, 1, high_open=True)  # --power


def add_engine_arguments(p) -> None:
    """The `--engine-url` mode's options of `compare`."""
    p.add_argument("--engine-url", default=None,
                   help="check a running OpenAI-compatible server instead of a trace: its /v1 base URL, e.g. "
                        "http://127.0.0.1:8000/v1 (needs --prompts; exit 1 when its answers are significantly less "
                        "likely under the reference, 2 when it cannot be asked, 3 when the run has too little power to "
                        "call it a pass)")
    p.add_argument("--prompts", default=None, help="--engine-url: prompts file, one per line (or .jsonl `prompt`)")
    p.add_argument("--chat", action="store_true", help="--engine-url: ask /chat/completions (one user message)")
    p.add_argument("--samples", type=int, default=4, help="--engine-url: answers per prompt and side (default 4)")
    p.add_argument("--max-tokens", type=int, default=32, help="--engine-url: max_tokens per answer (default 32)")
    p.add_argument("--api-key", default=None, help="--engine-url: bearer token for the server")
    p.add_argument("--seed", type=int, default=0, help="--engine-url: seed of sample s is seed + s (default 0)")
    p.add_argument("--served-model", default=None, help="--engine-url: model name to request (default: the first "
                                                        "of the server's /models)")
    p.add_argument("--request-timeout", type=_positive_float, default=REQUEST_TIMEOUT_S,
                   help=f"--engine-url: total seconds one request may take, connect to last byte (default "
                        f"{REQUEST_TIMEOUT_S:g}); a server that trickles bytes is cut off after it (exit 2)")
    p.add_argument("--power", type=_probability, default=POWER,
                   help=f"--engine-url: the power at which the minimum detectable difference is stated (default "
                        f"{POWER})")
    p.add_argument("--max-detectable", type=_positive_float, default=MAX_DETECTABLE,
                   help=f"--engine-url: a run whose minimum detectable difference exceeds this many nats per token "
                        f"is inconclusive, exit {EXIT_INCONCLUSIVE}, not a pass (default {MAX_DETECTABLE})")
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


def answer_ended(answer: Answer, ids: list[int]) -> bool:
    """Whether the answer ended on its own (EOS is then scored after its tokens): it says "stop", or it is empty
    and does not say "length" (nothing came before its end; `check_answers` refuses an empty "length" answer)."""
    return answer.finish_reason == "stop" or (not ids and answer.finish_reason != "length")


@torch.no_grad()
def score_answer(model, prompt: list[int], ids: list[int], stopped: bool, answer: Answer) -> AnswerScore:
    """Score one answer as a minimal trace: prompt + answer (+ EOS when it stopped), padded to whole canvases, each
    canvas fed back to the decoder after the ones before it are encoded. An empty answer that stopped is scored as
    its EOS alone."""
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


def name_ids_from_logprobs(tokenizer, answers: list[Answer]) -> None:
    """Answers without `token_ids` whose reported logprobs tokens name their ids for sure get those ids."""
    for a in answers:
        if a.token_ids is None and a.logprobs is not None:
            ids = ids_of_tokens(tokenizer, a.logprobs.tokens, a.text)
            if ids is not None:
                a.token_ids, a.ids_from = ids, "logprobs"


def longest_piece(tokenizer) -> int:
    """The most characters one token's text can have (its vocabulary piece, + 1 for a decoder that joins pieces
    with spaces): an answer of n tokens has at most n times this many characters."""
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) + 1


def check_answers(answers: list[Answer], tokenizer, vocab_size: int, max_tokens: int, url: str) -> None:
    """Refuse (EngineError naming the answer and the field) what cannot be an answer to the request asked: ids
    outside the vocabulary, more than `max_tokens` tokens (by its ids, its `usage.completion_tokens`, or a text too
    long for that many tokens), an empty answer whose finish_reason says it hit max_tokens."""
    widest = None
    for a in answers:
        where = f"{url} (prompt {a.prompt}, sample {a.sample})"
        field = "choices[0].token_ids" if a.ids_from == "token_ids" else "choices[0].logprobs tokens"
        if a.token_ids is not None:
            bad = [i for i in a.token_ids if not 0 <= i < vocab_size]
            if bad:
                raise EngineError(f"{where}: `{field}` holds ids outside this model's vocabulary [0, {vocab_size}): "
                                  f"{bad[:5]}")
            if len(a.token_ids) > max_tokens:
                raise EngineError(f"{where}: {len(a.token_ids)} tokens in `{field}`, more than the max_tokens "
                                  f"{max_tokens} it was asked for (the engine ignores max_tokens)")
        if a.completion_tokens is not None and a.completion_tokens > max_tokens:
            raise EngineError(f"{where}: `usage.completion_tokens` is {a.completion_tokens}, more than the "
                              f"max_tokens {max_tokens} it was asked for (the engine ignores max_tokens)")
        if a.token_ids is None:
            widest = widest or longest_piece(tokenizer)
            if len(a.text) > max_tokens * widest:
                raise EngineError(f"{where}: the text has {len(a.text)} characters, more than {max_tokens} tokens "
                                  f"of at most {widest} characters each can spell: more than the max_tokens "
                                  f"{max_tokens} it was asked for (the engine ignores max_tokens)")
        empty = not a.text if a.token_ids is None else not a.token_ids
        if empty and a.finish_reason == "length":
            raise EngineError(f"{where}: the answer is empty but `finish_reason` is \"length\" (max_tokens "
                              f"{max_tokens} reached without a token)")


def compare_engine(model, tokenizer, base: str, prompts: list[str], samples: int, max_tokens: int, chat: bool,
                   api_key: str | None, seed: int, model_name: str | None = None, logprobs: bool = False,
                   request_timeout: float = REQUEST_TIMEOUT_S, power: float = POWER,
                   max_detectable: float = MAX_DETECTABLE) -> dict:
    """Ask the server, generate with the reference, score both under the reference -> the summary (JSON-able).

    Raises:
        EngineError: a bad URL, an unreachable server, or a reply that is not an answer to the request (named).
    """
    base = check_base_url(base)
    name, window = declared_window(base, model_name, api_key, request_timeout)
    engine = engine_answers(base, name, prompts, samples, max_tokens, chat, api_key, seed, logprobs, request_timeout)
    name_ids_from_logprobs(tokenizer, engine)
    check_answers(engine, tokenizer, model.config.text_config.vocab_size, max_tokens,
                  f"{base}/chat/completions" if chat else f"{base}/completions")
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
        scored[side] = []
        for a in answers:
            ids = answer_tokens(tokenizer, a, use_ids)
            scored[side].append(score_answer(model, prompt_tokens[a.prompt], ids, answer_ended(a, ids), a))
    logprob = stratified_difference(scored["engine"], scored["reference"], "mean_logprob")
    logprob["p_beyond_margin"] = margin_p_value(logprob)
    logprob["power"] = power
    logprob["detectable"] = detectable_difference(logprob, power)
    top1 = stratified_difference(scored["engine"], scored["reference"], "argmax_agree")
    reported = compare_reported([(a.logprobs.logprobs, s.token_logprobs) for a, s in zip(engine, scored["engine"])
                                 if a.logprobs is not None and use_ids])
    sources = sorted({a.ids_from for a in engine}) if use_ids else ["text"]
    outcome = verdict_of(logprob, max_detectable)
    return {
        "mode": "engine", "engine_url": base, "served_model": name, "chat": chat, "prompts": len(prompts),
        "samples": samples, "max_tokens": max_tokens, "tokens_from": "+".join(sources),
        "decoder_window": {"engine": window, "reference": model.get_decoder().decoder_window},
        "reported_logprobs": reported,
        "text_id_mismatches": mismatched,
        "empty_answers": {side: sum(not (a.token_ids if a.token_ids is not None else a.text) for a in answers)
                          for side, answers in (("engine", engine), ("reference", reference))},
        "engine": side_summary(scored["engine"]), "reference": side_summary(scored["reference"]),
        "logprob_difference": logprob, "argmax_difference": top1,
        "test": {"alpha": ALPHA, "margin": MARGIN, "power": power, "max_detectable": max_detectable,
                 "kind": "stratified Welch t, one-sided, non-inferiority by the margin"},
        "verdict": outcome, "passed": outcome == "pass",
        "answers": {side: [{k: v for k, v in asdict(s).items() if k != "token_logprobs"} for s in scores]
                    for side, scores in scored.items()},
        "texts": {"engine": [a.text for a in engine], "reference": [a.text for a in reference]},
    }


def run_engine_compare(args, load) -> int:
    """The `compare --engine-url` command; `load(args)` -> (model, tokenizer). Exit 0 pass / 1 fail / 2 malformed
    input or reply / 3 inconclusive (too little power)."""
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
    try:
        check_base_url(args.engine_url)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, tokenizer = load(args)
    problem = prompt_problem(model, tokenizer, prompts, args.chat, args.max_tokens, args.prompts)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        summary = compare_engine(model, tokenizer, args.engine_url, prompts, args.samples, args.max_tokens,
                                 args.chat, args.api_key, args.seed, args.served_model, args.logprobs,
                                 args.request_timeout, args.power, args.max_detectable)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else format_engine_table(summary))
    return {"pass": 0, "fail": 1}.get(summary["verdict"], EXIT_INCONCLUSIVE)


def prompt_problem(model, tokenizer, prompts: list[str], chat: bool, max_tokens: int, path) -> str | None:
    """Why the reference cannot answer a prompt (naming the file and the prompt), or None: the chat template
    fails, or prompt + max_tokens (whole canvases) exceed the model's max_position_embeddings."""
    L, limit = model.canvas_length, model.config.text_config.max_position_embeddings
    for i, prompt in enumerate(prompts):
        try:
            ids = prompt_ids(tokenizer, prompt, chat)
        except Exception as e:  # noqa: BLE001 -- a tokenizer or template error of any kind names the prompt
            what = "apply its chat template to" if chat else "encode"
            return f"{path}: prompt {i + 1}: the tokenizer cannot {what} it: {e}"
        needed = len(ids) + -(-max_tokens // L) * L
        if needed > limit:
            return (f"{path}: prompt {i + 1} ({len(ids)} tokens) + --max-tokens {max_tokens} (whole canvases of {L}) "
                    f"need {needed} positions, more than the model's max_position_embeddings {limit}")
    return None
