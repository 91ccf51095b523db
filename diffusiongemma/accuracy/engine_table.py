"""The table `compare --engine-url` prints (accuracy/engine_compare.py) from its JSON summary."""

import math

from .engine_verdict import ALPHA, MARGIN


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
    empty = summary["empty_answers"]
    if empty["engine"] or empty["reference"]:
        lines.append(f"note: empty answers, scored as an immediate end (EOS): engine {empty['engine']}, reference "
                     f"{empty['reference']}")
    test = summary["test"]
    if d["difference"] is not None:
        lines.append(f"engine - reference, mean log-prob per token: {d['difference']:+.4f} nats, 95% CI "
                     f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}], t {_f(d['t'], 2)}, df {_f(d['df'], 1)}, "
                     f"p {_p(d['p_value'])}; p of more than {MARGIN} nats worse {_p(d['p_beyond_margin'])}")
        lines.append(f"engine - reference, argmax agreement: {t['difference']:+.4f}, 95% CI "
                     f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]")
        lines.append(f"minimum detectable difference: {d['detectable']:.4f} nats per token (found with probability "
                     f"{test['power']:g} at one-sided alpha {ALPHA}; a pass needs at most {test['max_detectable']:g})")
    if summary["verdict"] == "pass":
        lines.append(f"PASS: the engine's answers are not significantly less likely under the reference "
                     f"(fails when more than {MARGIN} nats per token worse with one-sided p < {ALPHA}), and the run "
                     f"could have found a deficit of {d['detectable']:.4f} nats per token")
    elif summary["verdict"] == "fail":
        lines.append(f"FAIL: the engine's answers are significantly less likely under the reference "
                     f"(more than {MARGIN} nats per token worse, one-sided p < {ALPHA})")
    else:
        lines.append(f"INCONCLUSIVE: not significantly worse, but the run could only have found a deficit of "
                     f"{_f(d['detectable'])} nats per token, more than --max-detectable {test['max_detectable']:g}: "
                     f"ask more prompts or --samples (the detectable difference shrinks as 1 / sqrt(answers))")
    return "\n".join(lines)
