"""`from_pretrained` / `save_pretrained` of `DiffusionGemmaForBlockDiffusion`: the one entry point of loading.

    load_pretrained      folder checks -> parallel plans -> text-only config -> compressed-tensors (compressed.py)
                         or transformers' loader (device maps, bitsandbytes: offload.py, bnb.py; renamed weight
                         prefixes: modeling/weights.py) -> strict check of every key
    generation_config_for  generation_config.json -> our generation config class
    save_atomically      transformers' save into a temporary sibling, swapped into place (io/atomic.py)

Under `pipeline(...)` a failed load raises `PipelineLoadError` (pipeline.py), so the pipeline cannot retry with
transformers' built-in class.
"""

import os
from typing import Callable

from ..generation_config import DiffusionGemmaGenerationConfig
from ..io.atomic import atomic_folder
from ..modeling.config import check_model_folder, text_only_config
from ..modeling.parallel_request import prepare_parallel_load
from ..modeling.weights import checkpoint_keys, key_mapping_for, loading_problems
from .compressed import check_weight_files, compressed_tensors_folder, load_compressed_tensors_checkpoint
from .offload import prepare_from_pretrained_kwargs
from .pipeline import PipelineLoadError, loading_for_a_pipeline

HUB_KWARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")


def load_pretrained(cls, base_from_pretrained: Callable, path, *model_args, strict: bool = True, **kwargs):
    """`cls.from_pretrained(path, ...)`; `base_from_pretrained` is transformers' `PreTrainedModel.from_pretrained`
    bound to `cls`. A failure under `pipeline(...)` becomes a `PipelineLoadError`."""
    if not (kwargs.get("_from_pipeline") or loading_for_a_pipeline()):
        return _load(cls, base_from_pretrained, path, *model_args, strict=strict, **kwargs)
    try:
        return _load(cls, base_from_pretrained, path, *model_args, strict=strict, **kwargs)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        # pipeline() catches exactly these four and moves on to the class named in config.architectures
        raise PipelineLoadError(
            f"{type(err).__name__}: {err}\n(diffusiongemma could not load {path}; the pipeline stops here rather "
            "than retry with transformers' built-in DiffusionGemma class)"
        ) from err


def _load(cls, base_from_pretrained: Callable, path, *model_args, strict: bool = True, **kwargs):
    local = str(path)
    if kwargs.get("subfolder"):
        local = os.path.join(local, kwargs["subfolder"])
    check_model_folder(local)  # exists, has config.json, is DiffusionGemma's
    if os.path.isdir(local):
        check_weight_files(local)  # one weight set, no stale shards
    kwargs = prepare_parallel_load(cls, path, kwargs)  # tensor / expert parallelism
    kwargs = text_only_config(path, kwargs)  # `"vision_config": null`: no vision tower
    folder = compressed_tensors_folder(path, kwargs)
    if folder is not None:
        return load_compressed_tensors_checkpoint(cls, folder, strict=strict, **kwargs)
    kwargs = prepare_from_pretrained_kwargs(cls, path, kwargs)  # device map, bnb
    if "key_mapping" not in kwargs:
        mapping = key_mapping_for(checkpoint_keys(str(path)))
        if mapping is not None:
            kwargs["key_mapping"] = mapping
    want_info = kwargs.pop("output_loading_info", False)
    allow_mismatch = kwargs.pop("ignore_mismatched_sizes", False)
    # Load with mismatches reported rather than raised, so the error below can name every offending key.
    model, info = base_from_pretrained(path, *model_args, output_loading_info=True, ignore_mismatched_sizes=True,
                                       **kwargs)
    if allow_mismatch:
        info = {**info, "mismatched_keys": set()}
    # a text-only checkpoint (loadable with strict=False) refuses images rather than read them with random weights
    model._vision_weights_missing = model.config.vision_config is None or any(
        ".vision_tower." in k or ".embed_vision." in k for k in info.get("missing_keys", ()))
    problems = loading_problems(info)
    if strict and problems:
        raise ValueError(f"checkpoint {path} does not match {cls.__name__}: " + "; ".join(problems)
                         + " (pass strict=False to load anyway)")
    model._weight_conversions = None  # always save the usual layout, whatever layout was loaded
    return (model, info) if want_info else model


def generation_config_for(generation_config=None, path=None, **repo_kwargs) -> DiffusionGemmaGenerationConfig | None:
    """Our generation config from transformers' (when it passes one) or from `path`'s generation_config.json; None
    when there is neither (the model keeps the defaults of spec A.5). A corrupt file is a ValueError."""
    if generation_config is not None:
        return DiffusionGemmaGenerationConfig.from_dict(generation_config.to_dict())
    if path is None:
        return None
    local = os.path.join(str(path), "generation_config.json")
    try:
        return DiffusionGemmaGenerationConfig.from_pretrained(
            path, **{k: v for k, v in repo_kwargs.items() if k in HUB_KWARGS})
    except OSError as error:  # no generation_config.json: keep the defaults; a corrupt one is an error
        if os.path.isfile(local):
            raise ValueError(f"{local} could not be read ({error}); fix or delete it (without it the model "
                             "loses its EOS and pad ids)") from None
        return None
    except (ValueError, TypeError, AttributeError) as error:  # not a dict of fields, or a field out of range
        raise ValueError(f"invalid generation_config.json in {path}: {error}") from None


def save_atomically(base_save_pretrained: Callable, save_directory, *args, overwrite: bool = True, **kwargs) -> None:
    """transformers' `save_pretrained` (`base_save_pretrained`) into a temporary sibling, swapped into place."""
    if kwargs.get("push_to_hub") and "repo_id" not in kwargs:
        kwargs["repo_id"] = os.path.basename(os.path.abspath(save_directory))
    with atomic_folder(save_directory, overwrite=overwrite) as work:
        base_save_pretrained(work, *args, **kwargs)
