"""Fine-tuning data from disk: a JSON-lines file or a `datasets` folder, every row checked and tokenized up front.

Each row is one of the collator's row shapes (`collator.py`): {"prompt", "completion"}, {"messages"} or
{"input_ids", "labels"}. A row the collator cannot use is a `RowError` naming its line (JSON lines, 1-based) or its
index (dataset folders) before any training starts.
"""

import json
import os

from .collator import DiffusionGemmaDataCollator, RowError


def read_rows(path: str) -> list[tuple[str, dict]]:
    """(where, row) for every row of a .jsonl file (blank lines skipped) or a `datasets.save_to_disk` folder."""
    if os.path.isdir(path):
        return _dataset_rows(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--data {path}: no such file or folder (a .jsonl file or a datasets folder)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"line {number} of {path}"
            try:
                rows.append((where, json.loads(line)))
            except json.JSONDecodeError as error:
                raise RowError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not rows:
        raise RowError(f"--data {path}: the file holds no rows (one JSON object per line)")
    return rows


def _dataset_rows(path: str) -> list[tuple[str, dict]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(f"--data {path} is a folder: reading a datasets folder needs `pip install datasets` "
                          "(extra `train`)") from None
    try:
        data = datasets.load_from_disk(path)
    except FileNotFoundError as error:
        raise RowError(f"--data {path}: not a datasets folder written by save_to_disk ({error})") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise RowError(f"--data {path}: a DatasetDict without a 'train' split (splits: {sorted(data)})")
        data = data["train"]
    rows = [(f"row {i} of {path}", row) for i, row in enumerate(data)]
    if not rows:
        raise RowError(f"--data {path}: the dataset holds no rows")
    return rows


def tokenize_rows(rows: list[tuple[str, dict]], collator: DiffusionGemmaDataCollator) -> list[dict]:
    """Every row through `collator.tokenize`, naming the first bad one; returns {"input_ids", "labels"} rows."""
    return [collator.tokenize(row, where) for where, row in rows]


def token_count(rows: list[dict]) -> int:
    return sum(len(r["input_ids"]) + len(r["labels"]) for r in rows)
