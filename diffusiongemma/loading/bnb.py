"""bitsandbytes (LLM.int8 and 4-bit NF4/FP4) through transformers' own HfQuantizer, with DiffusionGemma defaults.

bitsandbytes replaces `nn.Linear` modules only. In DiffusionGemma that means the attention projections
(`q/k/v/o_proj`) and the dense MLP (`mlp.gate/up/down_proj`) of every layer. The routed experts are fused 3-D
parameters (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), not Linears, so they stay in the
load dtype: on the 26B model that is ~87% of the weights, so bitsandbytes saves far less memory here than on a dense
model (use the FP8 / NVFP4 compressed-tensors checkpoints for that). By default we also keep in full precision what
the compressed-tensors releases keep: lm_head (tied to the embeddings), the routers (a flipped top-k changes which
experts run), self-conditioning, the vision tower and its projector.

Logs: loading through our `from_pretrained` keeps bitsandbytes to at most one line: its import-time warning about an
optional Hub kernel goes to the debug log, and its per-matmul "inputs will be cast to float16" warning is shown once.

Hardware: bitsandbytes >= 0.45 has CPU kernels for 8-bit and 4-bit; the 4-bit CPU path needs widths the block size
(64) divides, which ones depending on the CPU (AVX512-BF16 repacks the weights). Loading 4-bit for the CPU probes each
distinct Linear shape once (`keep_unpackable_layers`) and keeps the ones it cannot run unquantized, with one warning. CUDA is needed for the fast kernels and for 8-bit outlier
(LLM.int8 threshold) decomposition at speed.
"""

import copy
import logging
import re
import sys

from transformers import BitsAndBytesConfig

logger = logging.getLogger(__name__)

DEFAULT_SKIP_MODULES = ["lm_head", r".*\.router", r".*\.self_conditioning", r".*\.vision_tower", r".*\.embed_vision"]


def with_diffusiongemma_defaults(config: BitsAndBytesConfig) -> BitsAndBytesConfig:
    """A copy of `config` with `llm_int8_skip_modules` set to `DEFAULT_SKIP_MODULES` when the user gave none (the
    user's object is never changed, so it can be reused for another model).

    transformers matches each entry as a regex from the start of a module name up to a module boundary, or as a
    suffix (for 8-bit and 4-bit alike).
    """
    if getattr(config, "llm_int8_skip_modules", None) is not None:
        return config
    config = copy.deepcopy(config)
    config.llm_int8_skip_modules = list(DEFAULT_SKIP_MODULES)
    return config


CAST_WARNING = "MatMul8bitLt: inputs will be cast"  # bitsandbytes logs it on every 8-bit matmul of a non-fp16 input
KERNEL_WARNING = "Failed to load CPU gemm_4bit_forward from kernels-community"  # logged when bitsandbytes is imported


class _Once(logging.Filter):
    """Passes the first record whose message starts with `prefix`, drops the later ones; other records pass."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix, self.seen = prefix, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        if self.seen:
            return False
        self.seen = True
        return True


class _Drop(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.prefix):
            logger.debug("bitsandbytes: %s", record.getMessage())
            return False
        return True


def import_bitsandbytes_quietly() -> None:
    """Import bitsandbytes (if it is not imported yet) without its warning that an optional faster CPU 4-bit kernel
    could not be fetched from the Hub's kernels-community (the message goes to this module's debug log instead)."""
    if "bitsandbytes" in sys.modules:
        return
    ops_logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    drop = _Drop(KERNEL_WARNING)
    ops_logger.addFilter(drop)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        pass  # transformers' quantizer reports the missing package with its install hint
    finally:
        ops_logger.removeFilter(drop)


def log_cast_warning_once() -> None:
    """bitsandbytes' 8-bit matmul logs "inputs will be cast ... to float16" on every call whose input is not fp16
    (about 1,300 lines for one 32-token generate in fp32); the cast itself is how LLM.int8 works. Keep the first line
    and drop the repeats (only that message, on bitsandbytes' autograd logger)."""
    cast_logger = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _Once) for f in cast_logger.filters):
        cast_logger.addFilter(_Once(CAST_WARNING))


def _skipped(name: str, patterns) -> bool:
    """Whether transformers' bitsandbytes quantizer leaves module `name` alone: an entry matching from the start up
    to a module boundary (as a regex), or a suffix of the name."""
    for pattern in patterns or []:
        if name.endswith(pattern) or re.fullmatch(f"(?:{pattern})(?:\\..*)?", name):
            return True
    return False


def cpu_4bit_failure(in_features: int, out_features: int, config: BitsAndBytesConfig) -> str | None:
    """Run one tiny 4-bit Linear of this shape through bitsandbytes' CPU inference path; None when it works, else
    the error (its CPU kernels need widths the block size divides, and which ones depends on the CPU's features)."""
    import torch
    import bitsandbytes as bnb

    quant_type = getattr(config, "bnb_4bit_quant_type", "fp4")
    linear = bnb.nn.Linear4bit(in_features, out_features, bias=False, compute_dtype=torch.float32,
                               quant_type=quant_type, device="meta")
    linear.weight = bnb.nn.Params4bit(torch.randn(out_features, in_features), requires_grad=False,
                                      quant_type=quant_type)
    try:
        with torch.no_grad():
            linear = linear.to("cpu").eval()
            out = linear(torch.zeros(1, 2, in_features))
        return None if tuple(out.shape) == (1, 2, out_features) else f"output shape {tuple(out.shape)}"
    except Exception as error:  # noqa: BLE001 - AssertionError / RuntimeError from inside bitsandbytes
        return f"{type(error).__name__}: {error}"


def keep_unpackable_layers(model_class, model_config, config: BitsAndBytesConfig) -> BitsAndBytesConfig:
    """For 4-bit on CPU: the Linears whose shape bitsandbytes' CPU kernel cannot run stay unquantized (added to a
    copy of `llm_int8_skip_modules`), with one warning naming them; `config` itself is never changed.

    Without this, such a layer (e.g. hidden size 48) fails at the first forward, deep inside bitsandbytes
    ("N must be divisible by block_n").
    """
    import torch

    if not getattr(config, "load_in_4bit", False):
        return config
    with torch.device("meta"):
        skeleton = model_class._from_config(model_config)
    skip = list(getattr(config, "llm_int8_skip_modules", None) or [])
    linears = [(name, m.in_features, m.out_features) for name, m in skeleton.named_modules()
               if isinstance(m, torch.nn.Linear) and not _skipped(name, skip)]
    failures = {shape: cpu_4bit_failure(*shape, config) for shape in {(i, o) for _, i, o in linears}}
    kept = [(name, i, o) for name, i, o in linears if failures[(i, o)] is not None]
    if not kept:
        return config
    shapes = sorted({(i, o) for _, i, o in kept})
    logger.warning(
        "bitsandbytes' CPU 4-bit kernel cannot run %d Linear layer(s) of shape(s) %s (in -> out features; %s): they "
        "stay unquantized, e.g. %s", len(kept), ", ".join(f"{i} -> {o}" for i, o in shapes),
        failures[shapes[0]], kept[0][0])
    config = copy.deepcopy(config)
    config.llm_int8_skip_modules = skip + [re.escape(name) for name, _, _ in kept]
    return config
