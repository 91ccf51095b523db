"""Telling a load by transformers' `pipeline()` apart, and the error such a load raises instead of falling back."""

import sys


def loading_for_a_pipeline() -> bool:
    """Whether transformers' `pipeline()` is loading the model: its `load_model` is on the call stack.

    Why the stack and not a flag: `load_model` sets `_from_pipeline`, but through `AutoModelForCausalLM` it never
    reaches us (transformers 5.23: the Auto class loads the config first and `PreTrainedConfig.from_dict` drops the
    flag; `pipeline()` does not hand its config instance to `load_model`'s `from_pretrained`). The check only reads
    the stack of the calling thread; it switches nothing and nothing else depends on it.
    `tests/quantization/test_auto_and_pipeline_quantized.py` fails if a transformers release renames `load_model`,
    and `_from_pipeline` is honoured when it does arrive."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_model" and frame.f_globals.get("__name__") == "transformers.pipelines.base":
            return True
        frame = frame.f_back
    return False


class PipelineLoadError(Exception):
    """`from_pretrained` failed under `pipeline(...)`. Deliberately not a ValueError / TypeError / OSError /
    RuntimeError: the pipeline catches those and retries with the built-in class named in `config.architectures`."""
