"""Which files make a folder a tokenizer folder (used by `generate`, `quantize` and the converters)."""

import os

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def folder_has_tokenizer(path: str) -> bool:
    """Whether the local folder `path` holds at least one tokenizer file (False for anything that is not a folder)."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)
