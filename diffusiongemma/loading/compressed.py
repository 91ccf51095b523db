"""Load a compressed-tensors checkpoint (FP8 dynamic or NVFP4) into `DiffusionGemmaForBlockDiffusion`, compressed.

Why our own loader rather than transformers' compressed-tensors HfQuantizer: the quantizer decompresses or wraps
modules through compressed-tensors' generic forward, knows nothing about our per-expert layout (transformers 5.23
registers no per-expert <-> fused mapping for this model, spec F.3) and would not keep NVFP4 packed with our
kernels. Here the model is built on the meta device, every Linear the config quantizes is swapped for `FP8Linear` /
`NVFP4Linear`, fused experts are swapped for an `ExpertList` where the checkpoint stores per-expert Linears, and
the safetensors shards are streamed tensor by tensor onto their devices. Weights stay compressed in memory and are
dequantized per layer / per expert at compute time.

Every parameter and persistent buffer must come from the checkpoint with the right shape and dtype; anything else
raises `QuantizedCheckpointError` naming the keys (never a silent zero or random fill).
"""

import copy
import json
import os
import re
from collections import defaultdict

import torch
from accelerate import dispatch_model, init_empty_weights
from huggingface_hub import snapshot_download
from safetensors import safe_open
from transformers.utils import cached_file
from torch import nn

from diffusiongemma.modeling.validation import check_experts_implementation
from diffusiongemma.modeling.weights import checkpoint_names, checkpoint_shards, key_mapping_for, renamed_key
from diffusiongemma.io.config_files import read_quantization_config
from diffusiongemma.quantization.experts import empty_expert_lists
from diffusiongemma.quantization.fp8 import FP8_DTYPE, FP8Linear, check_fp8_supported
from diffusiongemma.quantization.nvfp4 import GROUP_SIZE, NVFP4Linear
from diffusiongemma.loading.offload import SPLIT_MAPS, pinned_device_map
from diffusiongemma.loading.twins import encoder_twins, merged_twin
from diffusiongemma.quantization.schemes import (
    FP8_DYNAMIC,
    NVFP4,
    ModuleScheme,
    QuantizedCheckpointError,
    parse_quantization_config,
    quantization_plan,
)

PER_EXPERT_KEY = re.compile(r"layers\.(\d+)\.experts\.\d+\.")
_PACKED_DTYPES = (FP8_DTYPE, torch.uint8)  # stored bytes: never cast


def is_compressed_tensors_checkpoint(path: str) -> bool:
    """Whether `path` is a local folder holding a compressed-tensors checkpoint (the loader of this module)."""
    raw = read_quantization_config(path)
    return isinstance(raw, dict) and raw.get("quant_method") == "compressed-tensors"


HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "proxies", "subfolder")
# Set by transformers' Auto classes and pipelines for their own bookkeeping; none of them changes what is loaded.
AUTO_BOOKKEEPING = ("_from_auto", "_from_pipeline", "trust_remote_code", "code_revision", "low_cpu_mem_usage")
SUPPORTED = ("dtype", "device_map", "max_memory", "offload_folder", "strict", "attn_implementation",
             "experts_implementation", "config", "fp8_kernel", "output_loading_info", "generation_config",
             "use_safetensors=True") + HUB_KWARGS


SHARD_NAME = re.compile(r"model-\d+-of-\d+\.safetensors$")


def check_weight_files(folder: str) -> None:
    """A local checkpoint folder must hold one weight set: `model.safetensors`, or an index and the shards it lists.

    A single file next to an index, or shard files the index does not list, are what an interrupted or overwritten
    save leaves behind; transformers would silently prefer one of them, so both are refused.

    Raises:
        ValueError: two competing weight sets, or shards the index does not list. FileNotFoundError: a listed shard
            is missing.
    """
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(index):
        return
    if os.path.isfile(single):
        raise ValueError(f"{folder} holds two competing weight sets, model.safetensors and a sharded "
                         "model.safetensors.index.json (left by an earlier save?): delete the stale one, or save again "
                         "with overwrite")
    try:
        with open(index) as f:
            listed = set(json.load(f)["weight_map"].values())
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{index} is not a valid safetensors index ({error})") from None
    missing = sorted(n for n in listed if not os.path.isfile(os.path.join(folder, n)))
    if missing:
        raise FileNotFoundError(f"{folder} is incomplete: its index lists shards that are missing: {missing[:5]}")
    stale = sorted(n for n in os.listdir(folder) if SHARD_NAME.match(n) and n not in listed)
    if stale:
        raise ValueError(f"{folder} holds shard files its index does not list (left by an earlier save?): "
                         f"{stale[:5]}; delete them, or save again with overwrite")


def compressed_tensors_folder(path, hub_kwargs: dict) -> str | None:
    """The local folder of a compressed-tensors checkpoint given as a folder or a Hub repo id (and `subfolder`, if
    `hub_kwargs` has one), else None.

    For a repo id only config.json is fetched first; the safetensors, tokenizer and generation files follow
    (`snapshot_download`) only when its quantization_config is compressed-tensors.
    """
    path, subfolder = str(path), hub_kwargs.get("subfolder") or ""
    if os.path.isdir(path):
        folder = os.path.join(path, subfolder) if subfolder else path
        return folder if is_compressed_tensors_checkpoint(folder) else None
    hub = {k: v for k, v in hub_kwargs.items() if k in HUB_KWARGS and k != "subfolder" and v is not None}
    try:
        config_file = cached_file(path, "config.json", subfolder=subfolder,
                                  _raise_exceptions_for_missing_entries=False, **hub)
    except (OSError, ValueError):
        return None  # not a reachable repo: let transformers' loader report it
    if config_file is None or not is_compressed_tensors_checkpoint(os.path.dirname(config_file)):
        return None
    patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
    if subfolder:
        patterns = [f"{subfolder}/{p}" for p in patterns]
    return os.path.join(snapshot_download(path, allow_patterns=patterns, **hub), subfolder)


def _checked_options(path: str, dtype, options: dict):
    """`dtype` (with transformers' older `torch_dtype` alias folded in) after checking that every other option in
    `options` is one this loader honours; anything else is a TypeError, never silently dropped."""
    options = dict(options)
    if "torch_dtype" in options:
        torch_dtype = options.pop("torch_dtype")
        if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
            raise TypeError(f"from_pretrained() of {path} got both dtype={dtype} and torch_dtype={torch_dtype}; "
                            "pass only dtype")
        dtype = torch_dtype if dtype is None else dtype
    adapter = options.pop("adapter_kwargs", None) or {}
    if "_adapter_model_path" in adapter:  # transformers' Auto class found a PEFT adapter_config.json
        raise TypeError(f"{path} holds a PEFT adapter; adapters on top of a compressed-tensors checkpoint are not "
                        "supported. Load the adapter's base model in bf16, or merge the adapter before quantizing.")
    if options.pop("use_safetensors", None) is False:
        raise TypeError(f"use_safetensors=False: the compressed-tensors checkpoint {path} is loaded from its "
                        "safetensors files only")
    unsupported = sorted(set(options) - set(HUB_KWARGS) - set(AUTO_BOOKKEEPING))
    if unsupported:
        raise TypeError(f"from_pretrained() of the compressed-tensors checkpoint {path} does not support "
                        f"{unsupported}; supported: {', '.join(SUPPORTED)}")
    return dtype


def _checkpoint_name(key: str, mapping: dict[str, str] | None) -> str:
    """Our key -> the name it has in the checkpoint (for error messages): the encoder-side name under a mapping."""
    return checkpoint_names(key)[-1] if mapping else key


def _quantized_module(linear: nn.Linear, scheme: ModuleScheme, dtype: torch.dtype, name: str,
                      fp8_kernel: str) -> nn.Module:
    bias = linear.bias is not None
    if scheme.kind == FP8_DYNAMIC:
        return FP8Linear(linear.in_features, linear.out_features, bias=bias, dtype=dtype, device="meta",
                         kernel=fp8_kernel)
    if linear.in_features % GROUP_SIZE:
        raise QuantizedCheckpointError(
            f"{name}: NVFP4 needs in_features to be a multiple of {GROUP_SIZE}, got {linear.in_features}; the "
            "quantization_config must list this module in `ignore`."
        )
    return NVFP4Linear(linear.in_features, linear.out_features, bias=bias, dtype=dtype, device="meta",
                       quantize_input=scheme.kind == NVFP4)


def swap_quantized_linears(model: nn.Module, plan: dict[str, ModuleScheme], dtype: torch.dtype,
                           fp8_kernel: str = "auto") -> nn.Module:
    """Replace every Linear named in `plan` by an empty FP8Linear / NVFP4Linear on the meta device (in place)."""
    for name, scheme in plan.items():
        parent, _, child = name.rpartition(".")
        linear = model.get_submodule(name)
        setattr(model.get_submodule(parent), child, _quantized_module(linear, scheme, dtype, name, fp8_kernel))
    return model


def _per_expert_layers(keys) -> set[int]:
    return {int(m.group(1)) for k in keys if (m := PER_EXPERT_KEY.search(k))}


def _use_per_expert_layout(model: nn.Module, layers: set[int]) -> None:
    stack = model.get_decoder()
    for i in sorted(layers):
        if i >= len(stack.layers):
            raise QuantizedCheckpointError(f"checkpoint has per-expert weights for layer {i}, the model has "
                                           f"{len(stack.layers)} layers")
        empty_expert_lists(stack.layers[i], device="meta")


def _resolve_dtype(dtype, config) -> torch.dtype:
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype


def _resolve_device_map(model: nn.Module, device_map, max_memory, dtype) -> dict[str, str]:
    if device_map is None:
        return {"": "cpu"}
    if isinstance(device_map, int):
        return {"": f"cuda:{device_map}"}
    if isinstance(device_map, torch.device) or (isinstance(device_map, str) and device_map not in SPLIT_MAPS):
        return {"": str(device_map)}
    if isinstance(device_map, dict):
        return {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in device_map.items()}
    return pinned_device_map(model, device_map, max_memory, dtype)


def _device_of(key: str, device_map: dict[str, str]) -> str:
    best, device = -1, "cpu"
    for prefix, dev in device_map.items():
        if (prefix == "" or key == prefix or key.startswith(prefix + ".")) and len(prefix) > best:
            best, device = len(prefix), dev
    return "cpu" if device == "disk" else device


def _coerce(key: str, value: torch.Tensor, expected: torch.Tensor, ckpt_name: str) -> torch.Tensor | str:
    """The checkpoint tensor converted for the model slot, or a problem description."""
    if tuple(value.shape) != tuple(expected.shape):
        return f"{ckpt_name} (checkpoint {tuple(value.shape)} {value.dtype}, expected {tuple(expected.shape)})"
    if expected.dtype in _PACKED_DTYPES or value.dtype in _PACKED_DTYPES:
        if value.dtype != expected.dtype:
            return f"{ckpt_name} (checkpoint dtype {value.dtype}, expected {expected.dtype})"
        return value
    if expected.is_floating_point() != value.is_floating_point():
        return f"{ckpt_name} (checkpoint dtype {value.dtype}, expected {expected.dtype})"
    return value.to(expected.dtype)


def _assign(model: nn.Module, key: str, value: torch.Tensor) -> None:
    module_name, _, attr = key.rpartition(".")
    module = model.get_submodule(module_name)
    if attr in module._parameters:
        trainable = value.is_floating_point() and value.dtype not in _PACKED_DTYPES and value.element_size() > 1
        frozen = not module._parameters[attr].requires_grad
        module._parameters[attr] = nn.Parameter(value, requires_grad=trainable and not frozen)
    else:
        module._buffers[attr] = value


def load_compressed_tensors_checkpoint(
    cls,
    path: str,
    *,
    dtype=None,
    device_map=None,
    max_memory: dict | None = None,
    offload_folder: str | None = None,
    strict: bool = True,
    output_loading_info: bool = False,
    attn_implementation: str | None = None,
    experts_implementation: str | None = None,
    config=None,
    quantization_config=None,
    fp8_kernel: str = "auto",
    generation_config=None,
    **options,
):
    """Build `cls` with compressed FP8 / NVFP4 Linears and stream the checkpoint's tensors into it.

    Args:
        cls: `DiffusionGemmaForBlockDiffusion` (or a subclass).
        path: local checkpoint folder whose config.json carries a compressed-tensors `quantization_config`.
        dtype: compute dtype of the unquantized weights and scales ("auto"/None: the config's dtype).
        device_map: None (CPU), a device, {"": device}, a module->device dict, or "auto"/"balanced"/"sequential"
            (accelerate; "disk" entries are offloaded to `offload_folder`).
        max_memory: per-device budget for the automatic maps, e.g. {"cpu": "2GiB", 0: "20GiB"}.
        offload_folder: where disk-mapped weights go.
        strict: False tolerates unexpected checkpoint tensors (missing or mis-shaped ones always raise).
        output_loading_info: also return {"missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"}.
        attn_implementation: "sdpa" (default), "eager" or "flex_attention"; anything else is a ValueError.
        experts_implementation: None, "grouped_mm" or "eager" (all run modeling/moe.py); anything else is a ValueError.
        config: a config to use instead of path's config.json.
        fp8_kernel: FP8 matmul: "auto" (torch._scaled_mm on CUDA GPUs with FP8 tensor cores, else dequantize +
            matmul), "scaled_mm" (native only: raises at load time where the hardware lacks FP8) or "dequant".
        quantization_config: must be None; the checkpoint's own config is used.
        generation_config: a `GenerationConfig` to use instead of path's generation_config.json.
        options: Hub arguments (`HUB_KWARGS`; `path` is already local, so they have been used by then), the
            `torch_dtype` alias of `dtype`, and what transformers' Auto classes and pipelines add (`AUTO_BOOKKEEPING`,
            `adapter_kwargs` without an adapter). Anything else is a TypeError.

    Returns:
        The model in eval mode (and the loading info when asked).

    Raises:
        QuantizedCheckpointError: unsupported scheme, or missing / mis-shaped / (strict) unexpected tensors.
    """
    path = str(path)
    dtype = _checked_options(path, dtype, options)
    if max_memory is not None and device_map not in SPLIT_MAPS:
        raise TypeError(f"max_memory is used by the automatic device maps {SPLIT_MAPS} only, got device_map="
                        f"{device_map!r}; pass device_map='auto' with it, or drop it")
    if quantization_config is not None:
        raise QuantizedCheckpointError(
            f"{path} is already a compressed-tensors checkpoint; passing quantization_config="
            f"{type(quantization_config).__name__} on top of it is not supported. Quantize the bf16 checkpoint "
            "instead, or drop the argument."
        )
    # the user's config stays unchanged: we set attn_implementation on it and building the model records more
    config = cls.config_class.from_pretrained(path) if config is None else copy.deepcopy(config)
    raw = getattr(config, "quantization_config", None) or read_quantization_config(path)
    if not isinstance(raw, dict):
        raw = raw.to_dict()
    qconfig = parse_quantization_config(raw, where=path)
    dtype = _resolve_dtype(dtype, config)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    if experts_implementation is not None:
        check_experts_implementation(experts_implementation)
        config._experts_implementation = experts_implementation

    shards = checkpoint_shards(path)
    if shards is None:
        raise QuantizedCheckpointError(f"{path} has no model.safetensors or model.safetensors.index.json")
    mapping = key_mapping_for(set(shards))  # None, or the encoder-layout renaming
    renamed = {renamed_key(k, mapping): k for k in shards}  # our key -> checkpoint key
    twins = encoder_twins(shards, mapping)  # written from the built-in class: quantized text tensors twice

    with init_empty_weights(include_buffers=False):
        model = cls._from_config(config, dtype=dtype)
    _use_per_expert_layout(model, _per_expert_layers(renamed))
    plan = quantization_plan(model, qconfig)
    swap_quantized_linears(model, plan, dtype, fp8_kernel)
    tied = {t: s for t, s in (cls._tied_weights_keys or {}).items()
            if getattr(config, "tie_word_embeddings", True) and t not in renamed and t.rpartition(".")[0] not in plan}

    expected = model.state_dict(keep_vars=True)
    devices = _resolve_device_map(model, device_map, max_memory, dtype)
    if fp8_kernel == "scaled_mm" and any(s.kind == FP8_DYNAMIC for s in plan.values()):
        for device in sorted({"cpu" if d == "disk" else d for d in devices.values()}):
            check_fp8_supported(device, "fp8_kernel")  # a clear error now rather than at the first forward
    problems, missing = [], sorted(k for k in expected if k not in renamed and k not in tied)
    twins = {k: t for k, t in twins.items() if k in expected}
    unexpected = sorted(renamed[k] for k in renamed if k not in expected and renamed[k] not in twins.values())
    by_shard = defaultdict(list)
    for key, ckpt_key in renamed.items():
        if key in expected:
            by_shard[shards[ckpt_key]].append((key, ckpt_key))
    for shard, entries in by_shard.items():
        with safe_open(shard, framework="pt", device="cpu") as f:
            for key, ckpt_key in entries:
                value = f.get_tensor(ckpt_key)
                if key in twins:
                    with safe_open(shards[twins[key]], framework="pt", device="cpu") as g:
                        value = merged_twin(key, value, g.get_tensor(twins[key]), twins[key])
                if isinstance(value, torch.Tensor):
                    value = _coerce(key, value, expected[key], ckpt_key)
                if isinstance(value, str):
                    problems.append(value)
                    continue
                _assign(model, key, value.to(_device_of(key, devices)))
    if missing or problems or (strict and unexpected):
        parts = []
        if missing:
            parts.append(f"missing tensors ({len(missing)}): {[_checkpoint_name(k, mapping) for k in missing[:12]]}")
        if problems:
            parts.append(f"tensors with the wrong shape or dtype ({len(problems)}): {problems[:12]}")
        if strict and unexpected:
            parts.append(f"unexpected tensors ({len(unexpected)}): {unexpected[:12]}")
        raise QuantizedCheckpointError(
            f"checkpoint {path} does not match DiffusionGemmaForBlockDiffusion under its quantization_config ("
            f"{len(plan)} quantized Linears): " + "; ".join(parts)
            + ". Per-expert checkpoints need every experts.{e}.gate_proj/up_proj/down_proj; a Linear the config "
            "quantizes needs its compressed tensors (FP8: weight, weight_scale; NVFP4: weight_packed, weight_scale, "
            "weight_global_scale[, input_global_scale])."
        )
    for target, source in tied.items():
        parent, _, attr = target.rpartition(".")
        setattr(model.get_submodule(parent), attr, model.get_parameter(source))

    if len(set(devices.values())) > 1 or "disk" in devices.values():
        dispatch_model(model, device_map=devices, offload_dir=offload_folder)
    if device_map is not None:  # as transformers: only a model loaded with a device_map has one (pipeline(device=)
        model.hf_device_map = devices  # refuses to move a model that has it)
    model.eval()
    model._weight_conversions = None
    model.adjust_generation_fn(generation_config=generation_config, pretrained_model_name_or_path=path)
    if output_loading_info:
        return model, {"missing_keys": set(), "unexpected_keys": set(unexpected), "mismatched_keys": set(),
                       "error_msgs": []}
    return model
