"""`verify_conversion`: re-read an Orbax checkpoint and its converted folder and list every disagreement.

Checks: the folder's config fits the checkpoint (every planned array found with the config's shape); every expected
key is present and no other is; each tensor has the config's dtype and shape; and each tensor's bytes equal its source
array transformed and cast to that dtype (exact; NaNs compare by bit pattern). Tensors are compared slice by slice
through a read-only memory map, so verification needs no more memory than conversion.
"""

import json
import os
import struct

import numpy as np

from ..modeling.config import check_config
from ..modeling.weights import checkpoint_shards
from .convert import load_config, release_freed_memory, return_large_buffers_to_the_os
from .orbax import OrbaxCheckpoint
from .plan import match_checkpoint
from .rules import expand_rules
from .safetensors_stream import DTYPE_NAMES
from .transform import streamed_chunks

__all__ = ["read_safetensors_header", "verify_conversion"]


def read_safetensors_header(file: str) -> tuple[dict, int]:
    """({key: {"dtype", "shape", "data_offsets"}}, byte offset where the data starts) of one safetensors file.

    Raises:
        ValueError: naming the file, when it is shorter than its header says, the header is not a JSON object of
            entries with `dtype`, `shape` and `data_offsets`, or an entry's bytes lie beyond the end of the file.
    """
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{file} is truncated: {size} bytes, shorter than a safetensors header length")
        (length,) = struct.unpack("<Q", prefix)
        if 8 + length > size:
            raise ValueError(f"{file} is truncated or not safetensors: its header claims {length} bytes, the file "
                             f"holds {size}")
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{file}: the safetensors header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    for key, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str)
                or not isinstance(entry.get("shape"), list) or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"{file}: header entry {key!r} is not {{dtype, shape, data_offsets}}: {entry!r}"[:300])
        if offsets[1] > data_bytes:
            raise ValueError(f"{file} is truncated: tensor {key} ends at byte {offsets[1]} of the data, which holds "
                             f"{data_bytes}")
    return header, 8 + length


def _differences(stored: np.ndarray, expected: np.ndarray, item_size: int) -> int:
    kind = {2: np.uint16, 4: np.uint32}[item_size]
    return int(np.count_nonzero(stored.view(kind) != expected.view(kind)))


def verify_conversion(src, dst, allow_unused: bool = False, progress: bool = False) -> list[str]:
    """Every mismatch between the Orbax checkpoint `src` and the converted folder `dst`, one readable line each
    (an empty list: the conversion is exact).

    The dtype and the text-only choice are read from `dst/config.json` (`vision_config: null` = text-only).
    """
    config_file = os.path.join(os.fspath(dst), "config.json")
    if not os.path.isfile(config_file):
        return [f"{dst} has no config.json: not a converted folder"]
    try:
        with open(config_file) as f:
            raw = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        return [f"{config_file} is not valid JSON ({error})"]
    if not isinstance(raw, dict):
        return [f"{config_file} must hold a JSON object"]
    text_only = raw.get("vision_config", {}) is None
    dtype = raw.get("dtype") or raw.get("text_config", {}).get("dtype") or "bfloat16"
    if dtype not in DTYPE_NAMES:
        return [f"{config_file}: dtype {dtype!r} is not one the converter writes ({', '.join(DTYPE_NAMES)})"]
    config = load_config(config_file)
    check_config(config)
    planned = expand_rules(config, text_only)
    return_large_buffers_to_the_os()
    checkpoint = OrbaxCheckpoint(src)
    plan, problems = match_checkpoint(checkpoint, planned, config, text_only, allow_unused, raise_on_problems=False)
    single = os.path.join(os.fspath(dst), "model.safetensors")
    index = os.path.join(os.fspath(dst), "model.safetensors.index.json")
    if os.path.isfile(single) and not os.path.isfile(index):
        try:
            read_safetensors_header(single)  # named errors, before safetensors' own reader sees the file
        except ValueError as error:
            return problems + [str(error)]
    try:
        shards = checkpoint_shards(os.fspath(dst)) or {}
    except Exception as error:  # noqa: BLE001 - a damaged index: say which file
        return problems + [f"{index if os.path.isfile(index) else single}: cannot be read ({error})"]
    if not shards:
        return problems + [f"{dst} holds no model.safetensors or model.safetensors.index.json"]
    headers = {}
    for file in sorted(set(shards.values())):
        if not os.path.isfile(file):
            problems.append(f"the index names {os.path.basename(file)}, which is not in {dst}")
            continue
        try:
            headers[file] = read_safetensors_header(file)
        except ValueError as error:  # truncated, or a damaged header: its tensors cannot be checked
            problems.append(str(error))
    expected = {t.key for t in planned}
    problems += [f"missing tensor {k}" for k in sorted(expected - set(shards))]
    problems += [f"unexpected tensor {k} (no rule writes it)" for k in sorted(set(shards) - expected)]
    tag, item_size = DTYPE_NAMES[dtype]
    from tqdm.auto import tqdm

    reads, reader = plan.reads_per_source(), None
    for item in tqdm(plan.tensors, desc="verifying", unit="tensor", disable=not progress):
        file = shards.get(item.key)
        if file not in headers:
            continue
        header, data_start = headers[file]
        entry = header.get(item.key)
        if entry is None:
            problems.append(f"{item.key}: the index names {os.path.basename(file)}, which does not hold it")
            continue
        if entry["dtype"] != tag or tuple(entry["shape"]) != item.shape:
            problems.append(f"{item.key}: config says {dtype} {item.shape}, file holds {entry['dtype']} "
                            f"{tuple(entry['shape'])}")
            continue
        path = plan.sources[item.key]
        if reader is None or reader.info.path != path:
            reader = checkpoint.reader(path, reads[path])
        start, end = entry["data_offsets"]
        stored = np.memmap(file, np.uint8, "r", offset=data_start + start, shape=(end - start,))
        position, differ = 0, 0
        for chunk in streamed_chunks(reader, item, dtype):
            differ += _differences(np.asarray(stored[position:position + chunk.nbytes]), chunk, item_size)
            position += chunk.nbytes
        del stored
        release_freed_memory()
        if differ:
            where = f"params/{path}" + (f"[{', '.join(map(str, item.select))}]" if item.select else "")
            problems.append(f"{item.key}: {differ} of {(end - start) // item_size} values differ from {where} "
                            f"converted to {dtype}")
    return problems
