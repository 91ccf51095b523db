"""Which compressed-tensors quantization configs this package can run, and which modules each one covers (spec F).

The config is parsed by compressed-tensors itself (`QuantizationConfig`), and targets/ignore are matched with its
own `is_match` (a `re:` prefix is a regex matched at the start of the module name, anything else an exact module
name or a class name in the module's MRO). Both ignore styles of spec F.4 work: the explicit module names an LLM
Compressor one-shot run writes, and the regex lists of `model_free_ptq`.

Module names may be written for either text stack: checkpoints store the one text stack under `model.decoder.*`
(or `model.encoder.language_model.*`), and both names of a module are tried (`modeling.weights.checkpoint_names`,
the one table of checkpoint prefixes).

The modules matched are the Linears that hold their own `weight`, named as in transformers' built-in class: the vision
tower's `AdaptableClippableLinear` wrappers (Linears to `isinstance`, for PEFT) are skipped, and their `.linear`
child is matched, as LLM Compressor matches it on the built-in model (spec F.4: `...self_attn.q_proj.linear`).
"""

from dataclasses import dataclass

from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
from compressed_tensors.utils import is_match
from torch import nn

from diffusiongemma.modeling.weights import checkpoint_names

FP8_DYNAMIC = "fp8-dynamic"
NVFP4 = "nvfp4"
NVFP4_WEIGHT_ONLY = "nvfp4-a16"

FORMAT_OF = {FP8_DYNAMIC: "float-quantized", NVFP4: "nvfp4-pack-quantized", NVFP4_WEIGHT_ONLY: "nvfp4-pack-quantized"}

SUPPORTED = (
    "FP8 dynamic (weights float8_e4m3 per output channel, activations float8 per token at run time; format "
    "'float-quantized', preset FP8_DYNAMIC) and NVFP4 (weights FP4 E2M1 in groups of 16 with FP8 group scales; "
    "activations the same with a static input_global_scale, or unquantized; format 'nvfp4-pack-quantized', presets "
    "NVFP4 / NVFP4A16)"
)
WHAT_TO_DO = (
    "Re-quantize the bf16 checkpoint with `diffusiongemma quantize --scheme fp8-dynamic|nvfp4 SRC DST`, load the "
    "bf16 checkpoint with `quantization_config=BitsAndBytesConfig(...)`, or serve this checkpoint with vLLM."
)


class QuantizedCheckpointError(ValueError):
    """A quantized checkpoint this package cannot load: unsupported scheme, missing or mis-shaped tensors."""


@dataclass(frozen=True)
class ModuleScheme:
    """How one Linear is stored: `kind` is FP8_DYNAMIC, NVFP4 or NVFP4_WEIGHT_ONLY; `group` names the config group."""

    kind: str
    group: str


def parse_quantization_config(raw: dict, where: str = "the checkpoint") -> QuantizationConfig:
    """Validate a `quantization_config` dict from config.json with compressed-tensors and check we can run it.

    Args:
        raw: the JSON object.
        where: folder name for error messages.

    Returns:
        The parsed `QuantizationConfig`.

    Raises:
        QuantizedCheckpointError: another quant_method, a status other than "compressed", sparsity, transforms, a KV
            cache scheme, or a group whose scheme is not one of `SUPPORTED`.
    """
    method = raw.get("quant_method")
    if method != "compressed-tensors":
        raise QuantizedCheckpointError(
            f"{where} has quantization_config.quant_method={method!r}; this loader reads 'compressed-tensors' "
            f"checkpoints only, in these schemes: {SUPPORTED}. {WHAT_TO_DO}"
        )
    for field in ("sparsity_config", "transform_config"):
        if raw.get(field):
            raise QuantizedCheckpointError(
                f"{where} uses a compressed-tensors {field} ({raw[field]}), which is not supported; only "
                f"{SUPPORTED} without sparsity or transforms. {WHAT_TO_DO}"
            )
    fields = {k: v for k, v in raw.items() if k in QuantizationConfig.model_fields}
    try:
        config = QuantizationConfig.model_validate(fields)
    except Exception as err:  # pydantic's message names the bad field
        raise QuantizedCheckpointError(f"{where}: compressed-tensors cannot parse its quantization_config: {err}") from err
    status = str(getattr(config.quantization_status, "value", config.quantization_status))
    if status != "compressed":
        raise QuantizedCheckpointError(
            f"{where} has quantization_status={status!r}; only 'compressed' checkpoints (as written by LLM "
            f"Compressor, model_free_ptq or `diffusiongemma quantize`) can be loaded. {WHAT_TO_DO}"
        )
    if config.kv_cache_scheme is not None:
        raise QuantizedCheckpointError(
            f"{where} quantizes the KV cache ({config.kv_cache_scheme}); KV-cache quantization is not supported. "
            f"{WHAT_TO_DO}"
        )
    for name, scheme in config.config_groups.items():
        kind = scheme_kind(scheme, scheme.format, f"{where}, config group {name!r}")
        if config.format not in (None, FORMAT_OF[kind], "mixed-precision"):
            scheme_kind(scheme, config.format, f"{where}, config group {name!r}")  # raises, naming the format
    return config


def _describe(args) -> str:
    if args is None:
        return "none"
    dynamic = getattr(args.dynamic, "value", args.dynamic)
    return (f"{args.num_bits}-bit {args.type}, strategy={getattr(args.strategy, 'value', args.strategy)}, "
            f"group_size={args.group_size}, symmetric={args.symmetric}, dynamic={dynamic}")


def scheme_kind(scheme: QuantizationScheme, fmt: str | None, where: str = "quantization scheme") -> str:
    """FP8_DYNAMIC, NVFP4 or NVFP4_WEIGHT_ONLY for a scheme we can run; raises QuantizedCheckpointError otherwise."""
    w, a = scheme.weights, scheme.input_activations

    def fits(args, bits: int, strategy: str, group: int | None, dynamic) -> bool:
        return (
            args is not None and args.num_bits == bits and args.type == "float" and args.symmetric
            and args.strategy == strategy and args.group_size == group
            and getattr(args.dynamic, "value", args.dynamic) == dynamic and not args.actorder
        )

    kind = None
    if scheme.output_activations is None and fits(w, 8, "channel", None, False):
        if fits(a, 8, "token", None, True):
            kind = FP8_DYNAMIC
    elif scheme.output_activations is None and fits(w, 4, "tensor_group", 16, False):
        if a is None:
            kind = NVFP4_WEIGHT_ONLY
        elif fits(a, 4, "tensor_group", 16, "local"):
            kind = NVFP4
    if kind is None:
        raise QuantizedCheckpointError(
            f"{where}: unsupported scheme (weights: {_describe(w)}; input activations: {_describe(a)}; output "
            f"activations: {_describe(scheme.output_activations)}). Supported: {SUPPORTED}. {WHAT_TO_DO}"
        )
    if fmt is not None and fmt != FORMAT_OF[kind]:
        raise QuantizedCheckpointError(
            f"{where}: the scheme is {kind} but the format is {fmt!r}; {kind} is stored as {FORMAT_OF[kind]!r}. "
            f"Supported: {SUPPORTED}. {WHAT_TO_DO}"
        )
    return kind


def weight_linears(model: nn.Module):
    """(name, module) for every Linear of `model` that holds its own `weight` parameter.

    These are the modules compressed-tensors quantizes when it runs on transformers' built-in class. A Linear that
    only reads its weight through a child (the vision tower's `AdaptableClippableLinear`: `weight` is
    `self.linear.weight`) is left out; its child is the one a checkpoint names and compresses.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and "weight" in module._parameters:
            yield name, module


def quantization_plan(model: nn.Module, config: QuantizationConfig) -> dict[str, ModuleScheme]:
    """Which Linear modules of `model` the config quantizes, and how.

    A module is quantized when any of its names matches a group's `targets` and none matches `ignore` (compressed-
    tensors' `is_match`). Only Linear modules are considered: compressed-tensors compresses nothing else, so a
    name-only match on an embedding or a norm is never a quantized weight (spec F.4), and only Linears that hold their
    own weight (`weight_linears`): a vision wrapper's `.linear` child is decided by its own name. Groups are tried in
    order.

    Args:
        model: our model, with per-expert `ExpertList`s where the checkpoint stores experts per expert.
        config: the parsed config.

    Returns:
        {module name: ModuleScheme} for every quantized Linear.
    """
    plan = {}
    ignore = config.ignore or []
    for name, module in weight_linears(model):
        names = checkpoint_names(name)  # ours, and the encoder-side name of a shared text-stack module
        if any(is_match(n, module, ignore) for n in names):
            continue
        for group, scheme in config.config_groups.items():
            if any(is_match(n, module, scheme.targets) for n in names):
                plan[name] = ModuleScheme(scheme_kind(scheme, scheme.format), group)
                break
    return plan
