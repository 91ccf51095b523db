"""`convert_orbax`: stream an Orbax DiffusionGemma checkpoint into a Hugging Face folder (spec G, B.2, A.5).

One array at a time: read the selection a planned tensor needs (a stacked vision array one layer slice at a time),
transform and cast it in 16 MB slices, append the bytes to a safetensors shard whose header was written up front.
Peak memory is the largest array read plus the slices plus the imports, never a shard or the model. The folder is
written by `diffusiongemma.io.atomic_folder`: an interrupted conversion leaves no complete-looking DST.
"""

import copy
import ctypes
import json
import os
import shutil
import time
from pathlib import Path

from ..io.atomic import atomic_folder, holds_checkpoint, is_checkpoint_file
from ..modeling.config import DiffusionGemmaConfig, check_config
from .orbax import OrbaxCheckpoint
from .plan import match_checkpoint
from .rules import expand_rules
from .safetensors_stream import DTYPE_NAMES, ShardedWriter, TensorEntry, parse_size, plan_shards
from .transform import TORCH_DTYPES, streamed_chunks

__all__ = ["RELEASED_CONFIG", "RELEASED_GENERATION_CONFIG", "convert_orbax", "load_config", "write_configs"]

# spec A.4: the released 26B-A4B config, as the upstream converter builds it
RELEASED_CONFIG = {
    "text_config": dict(
        vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16,
        num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
        use_bidirectional_attention="vision", num_experts=128, moe_intermediate_size=704, top_k_experts=8,
        sliding_window=1024, final_logit_softcapping=30.0, max_position_embeddings=262144, rms_norm_eps=1e-6,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    ),
    "vision_config": dict(
        model_type="gemma4_vision", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, head_dim=72, pooling_kernel_size=3,
        use_clipped_linears=False, standardize=True, global_head_dim=72, default_output_length=280,
    ),
    "canvas_length": 256,
    "vision_soft_tokens_per_image": 280,
}
# spec A.5: the released generation_config.json
RELEASED_GENERATION_CONFIG = dict(
    max_new_tokens=256, max_denoising_steps=48, t_min=0.4, t_max=0.8, stability_threshold=1,
    confidence_threshold=0.005, eos_token_id=[1, 106, 50], pad_token_id=0, return_dict_in_generate=True,
)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _libc():
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def return_large_buffers_to_the_os() -> None:
    """Make glibc give every buffer of 1 MiB or more its own mapping, unmapped when freed. TensorStore decodes in its
    own threads, whose malloc arenas would otherwise keep each freed chunk buffer resident, so resident memory would
    climb well past the live data. Process-wide and harmless; a no-op without glibc's `mallopt`."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, 2**20)


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (after each tensor); a no-op without glibc's `malloc_trim`."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def load_config(path=None) -> DiffusionGemmaConfig:
    """The target config: a DiffusionGemmaConfig JSON file (or a folder holding config.json); None: spec A.4's."""
    if path is None:
        return DiffusionGemmaConfig(**copy.deepcopy(RELEASED_CONFIG))
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"--config {path}: no such file (expected a DiffusionGemmaConfig JSON)")
    with open(file) as f:
        try:
            data = json.load(f)
        except ValueError as error:
            raise ValueError(f"--config {file} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {file} must hold a JSON object (a DiffusionGemmaConfig), got a JSON "
                         f"{type(data).__name__}")
    if data.get("model_type") not in (None, DiffusionGemmaConfig.model_type):
        raise ValueError(f"--config {file} describes a {data['model_type']!r} model, not DiffusionGemma "
                         f"(model_type {DiffusionGemmaConfig.model_type!r})")
    return DiffusionGemmaConfig.from_dict({k: v for k, v in data.items() if k != "model_type"})


def write_configs(config: DiffusionGemmaConfig, folder, dtype: str, text_only: bool) -> None:
    """config.json (as transformers' built-in class saves it; `vision_config: null` when text-only) and the released
    generation_config.json (spec A.5)."""
    from ..generation.config import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig

    config = copy.deepcopy(config)
    config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    for sub in (config, config.text_config, config.vision_config):
        sub.dtype = dtype
    config.save_pretrained(folder)
    if text_only:
        file = os.path.join(folder, "config.json")
        with open(file) as f:
            data = json.load(f)
        data["vision_config"] = None
        with open(file, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    generation = DiffusionGemmaGenerationConfig(
        **RELEASED_GENERATION_CONFIG, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1))
    generation.save_pretrained(folder)


def copy_tokenizer(source, folder) -> list[str]:
    """Copy a tokenizer/processor folder's files (not its weights or configs) into `folder`; returns the names."""
    source = os.fspath(source)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"--tokenizer {source}: no such folder")
    copied = []
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if os.path.isfile(path) and not is_checkpoint_file(name):
            shutil.copy2(path, os.path.join(folder, name))
            copied.append(name)
    if not copied:
        raise ValueError(f"--tokenizer {source} holds no tokenizer or processor files")
    return copied


def _progress(total_bytes: int, arrays: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled,
                desc=f"converting {arrays} tensors", dynamic_ncols=True)


def convert_orbax(src, dst, config=None, dtype: str = "bfloat16", text_only: bool = False,
                  max_shard_size="5GB", tokenizer=None, overwrite: bool = False, allow_unused: bool = False,
                  progress: bool = True) -> dict:
    """Convert the Orbax checkpoint `src` (rooted at params/transformer/, spec G) into a Hugging Face folder `dst`.

    Args:
        src: Orbax PyTree checkpoint folder (holds _METADATA).
        dst: output folder: config.json, generation_config.json, safetensors shards (+ index when more than one).
        config: a DiffusionGemmaConfig, a path to its JSON, or None for the released 26B-A4B config (spec A.4).
        dtype: "bfloat16" (default), "float16" or "float32"; every array goes through float32 first.
        text_only: leave out the vision tower and projector; config.json gets `vision_config: null`.
        max_shard_size: shard size, e.g. "5GB" (10**9 bytes) or "2GiB", or an int of bytes.
        tokenizer: a tokenizer/processor folder to copy into `dst`.
        overwrite: replace a `dst` that already holds a checkpoint (refused otherwise, before any work).
        allow_unused: skip arrays no rule converts instead of failing.
        progress: show a tqdm bar (bytes written, tensors done).
    Returns:
        {"tensors", "bytes", "shards", "seconds", "largest_array_bytes"}.
    Raises:
        ConversionError: missing or mis-shaped arrays, a config that does not fit (every problem listed).
        FileExistsError: `dst` holds a checkpoint and `overwrite` is False. ImportError: TensorStore missing.
    """
    start = time.perf_counter()
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
    shard_bytes = parse_size(max_shard_size)
    if os.path.realpath(src) == os.path.realpath(dst):  # realpath: a DST that is a symlink to SRC is SRC
        raise ValueError(f"the output folder must differ from the Orbax checkpoint folder ({src}; {dst} resolves "
                         f"to {os.path.realpath(dst)})")
    if Path(dst).is_symlink():
        raise ValueError(f"{dst} is a symbolic link (to {os.path.realpath(dst)}): the conversion would replace the "
                         "link, not write where it points; pass the real folder")
    if not overwrite and holds_checkpoint(Path(dst)):
        raise FileExistsError(f"{dst} already holds a checkpoint: pass --overwrite to replace it")
    if tokenizer is not None and not os.path.isdir(tokenizer):  # before the conversion, not after it
        raise FileNotFoundError(f"--tokenizer {tokenizer}: no such folder")
    if not isinstance(config, DiffusionGemmaConfig):
        config = load_config(config)
    check_config(config)
    return_large_buffers_to_the_os()
    checkpoint = OrbaxCheckpoint(src)
    plan, _ = match_checkpoint(checkpoint, expand_rules(config, text_only), config, text_only, allow_unused)
    entries = [TensorEntry(t.key, t.shape, dtype) for t in plan.tensors]
    shards = plan_shards(entries, shard_bytes)
    total = sum(e.nbytes for e in entries)
    reads = plan.reads_per_source()
    largest = max(checkpoint.array(p).nbytes for p in reads)
    with atomic_folder(dst, overwrite=overwrite) as work:
        writer = ShardedWriter(str(work), shards)
        bar = _progress(total, len(entries), progress)
        try:
            reader, done = None, 0
            for item in plan.tensors:
                path = plan.sources[item.key]
                if reader is None or reader.info.path != path:
                    reader = checkpoint.reader(path, reads[path])
                writer.begin(item.key)
                for chunk in streamed_chunks(reader, item, dtype):
                    writer.write(chunk)
                    bar.update(chunk.nbytes)
                release_freed_memory()
                done += 1
                bar.set_postfix_str(f"{done}/{len(entries)} tensors", refresh=False)
            reader = None
            parameters = sum(e.nbytes // DTYPE_NAMES[dtype][1] for e, t in zip(entries, plan.tensors)
                             if not t.buffer)  # the index's total_parameters: parameters, not buffers
            writer.finish(parameters)
        finally:
            writer.close()
            bar.close()
        write_configs(config, work, dtype, text_only)
        if tokenizer is not None:
            copy_tokenizer(tokenizer, work)
    return {"tensors": len(entries), "bytes": total, "shards": len(shards), "largest_array_bytes": largest,
            "seconds": time.perf_counter() - start}
