"""Evaluation with lm-evaluation-harness: `import diffusiongemma.evaluation` registers the lm-eval model
"diffusiongemma" (`adapter.py`, needs the `eval` extra: `pip install "diffusiongemma[eval]"`); `elbo.py` is the
block-diffusion log-likelihood it scores with, usable without lm-eval. See docs/evaluation.md."""

from .elbo import ElboEstimate, continuation_loglikelihood

NEEDS_LM_EVAL = ("the lm-eval adapter needs lm-evaluation-harness: pip install \"diffusiongemma[eval]\" (tested with "
                 "lm_eval 0.4.13)")

try:
    import lm_eval  # noqa: F401
except ImportError:  # the package works without the extra; the adapter says what to install when asked for
    lm_eval = None

if lm_eval is not None:
    from .adapter import DiffusionGemmaLM  # registers the lm-eval model "diffusiongemma"


def __getattr__(name: str):
    if name == "DiffusionGemmaLM":  # only reached without lm-eval
        raise ImportError(NEEDS_LM_EVAL)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DiffusionGemmaLM", "ElboEstimate", "continuation_loglikelihood"]
