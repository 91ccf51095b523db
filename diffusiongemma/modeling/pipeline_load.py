"""Telling a load by transformers' `pipeline()` apart, and the error such a load raises instead of falling back."""

import sys


def _loading_for_a_pipeline() -> bool:
    """Whether transformers' `pipeline()` is loading the model: its `load_model` is on the call stack. (The
    `_from_pipeline` flag it sets does not reach us through `AutoModelForCausalLM`: the Auto class's config loading
    consumes it.)"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_model" and frame.f_globals.get("__name__") == "transformers.pipelines.base":
            return True
        frame = frame.f_back
    return False


class PipelineLoadError(Exception):
    """`from_pretrained` failed under `pipeline(...)`. Deliberately not a ValueError / TypeError / OSError /
    RuntimeError: the pipeline catches those and retries with the built-in class named in `config.architectures`."""
