"""Device maps for models bigger than memory (accelerate's CPU / disk offload), with DiffusionGemma's pins.

accelerate loads an offloaded module's weights only while that module's `forward` runs. DiffusionGemma reads the
token embedding outside its forward (self-conditioning soft embeddings `embed_tokens.soft`, spec C.9, and dtype
queries in `generate`), and `lm_head` is tied to it, so both are pinned to the main (first non-disk) device. Whole
layers are never split (`_no_split_modules`); layer scalars are buffers, which accelerate keeps on the execution
device by default.
"""

import copy

import torch
from accelerate import infer_auto_device_map, init_empty_weights
from accelerate.utils import get_balanced_memory
from torch import nn

SPLIT_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
PINNED = ("model.decoder.embed_tokens", "lm_head")


def _split_off(device_map: dict, model: nn.Module, name: str, device) -> dict:
    """`device_map` with module `name` (and nothing else) moved to `device`, splitting coarser entries as needed."""
    out = dict(device_map)
    while True:
        owner = max((p for p in out if p == "" or name == p or name.startswith(p + ".")), key=len, default=None)
        if owner is None or owner == name:
            break
        dev = out.pop(owner)
        parent = model.get_submodule(owner) if owner else model
        for child, _ in parent.named_children():
            out[f"{owner}.{child}" if owner else child] = dev
        for pname, _ in list(parent.named_parameters(recurse=False)) + list(parent.named_buffers(recurse=False)):
            out[f"{owner}.{pname}" if owner else pname] = dev
    out[name] = device
    return out


def main_device(device_map: dict):
    """The first device that is not "disk" (CPU when everything is offloaded)."""
    devices = [d for d in device_map.values() if d not in ("disk", "cpu")]
    return devices[0] if devices else "cpu"


def pinned_device_map(model: nn.Module, device_map: str, max_memory: dict | None = None,
                      dtype: torch.dtype | None = None) -> dict:
    """accelerate's automatic map for `model` (meta or real), never splitting a layer, with `PINNED` on the main device.

    Args:
        model: the model whose module names the map uses.
        device_map: "auto", "balanced", "balanced_low_0" or "sequential".
        max_memory: per-device budget, e.g. {"cpu": "2GiB", 0: "20GiB"}; what does not fit goes to "disk".
        dtype: dtype used to size weights that are not yet in their final dtype.

    Returns:
        {module name: device or "disk"}.
    """
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # lm_head shares the embedding: size it once (and accelerate warns about untied weights)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    if device_map != "sequential":
        max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype,
                                         low_zero=device_map == "balanced_low_0")
    auto = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype)
    device = main_device(auto)
    for name in PINNED:
        auto = _split_off(auto, model, name, device)
    return auto


def device_map_for_checkpoint(cls, config, device_map: str, max_memory: dict | None, dtype) -> dict:
    """`pinned_device_map` for a model of class `cls` built from `config` on the meta device (`config` unchanged:
    building a model records its attention, experts and dtype choices on the config it is given)."""
    config = copy.deepcopy(config)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype in (None, "auto"):
        dtype = getattr(config, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with init_empty_weights():
        model = cls._from_config(config, dtype=dtype)
    return pinned_device_map(model, device_map, max_memory, dtype)


def prepare_from_pretrained_kwargs(cls, path, kwargs: dict) -> dict:
    """`from_pretrained` kwargs with our defaults: pinned automatic device maps, bitsandbytes skip list (and its
    logs kept to one line: `loading.bnb`)."""
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("device_map"), str) and kwargs["device_map"] in SPLIT_MAPS:
        config = kwargs.get("config") or cls.config_class.from_pretrained(path)
        kwargs["device_map"] = device_map_for_checkpoint(
            cls, config, kwargs["device_map"], kwargs.get("max_memory"), kwargs.get("dtype"))
    quantization = kwargs.get("quantization_config")
    if type(quantization).__name__ == "BitsAndBytesConfig":
        from diffusiongemma.loading.bnb import with_diffusiongemma_defaults

        kwargs["quantization_config"] = with_diffusiongemma_defaults(quantization)
    if _uses_bitsandbytes(path, kwargs):
        from diffusiongemma.loading.bnb import import_bitsandbytes_quietly, log_cast_warning_once

        import_bitsandbytes_quietly()
        log_cast_warning_once()
    quantization = kwargs.get("quantization_config")
    if type(quantization).__name__ == "BitsAndBytesConfig" and _runs_on_cpu(kwargs.get("device_map")):
        from diffusiongemma.loading.bnb import keep_unpackable_layers

        config = kwargs.get("config") or cls.config_class.from_pretrained(path)
        kwargs["quantization_config"] = keep_unpackable_layers(cls, config, quantization)
    return kwargs


def _runs_on_cpu(device_map) -> bool:
    """Whether a bitsandbytes model loaded with this device map runs on the CPU (its 4-bit CPU kernels apply)."""
    import torch

    if device_map in ("cpu", torch.device("cpu")) or device_map == {"": "cpu"}:
        return True
    return device_map is None and not torch.cuda.is_available()


def _uses_bitsandbytes(path, kwargs: dict) -> bool:
    """A BitsAndBytesConfig argument, or a config (given, or path's config.json) saved with one."""
    from diffusiongemma.io.config_files import read_quantization_config

    config = kwargs.get("config")
    for quantization in (kwargs.get("quantization_config"), getattr(config, "quantization_config", None),
                         read_quantization_config(path) if config is None else None):
        if type(quantization).__name__ == "BitsAndBytesConfig":
            return True
        if isinstance(quantization, dict) and quantization.get("quant_method") == "bitsandbytes":
            return True
    return False
