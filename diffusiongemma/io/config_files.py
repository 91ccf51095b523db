"""What a checkpoint folder's config.json says, read without building a config (a leaf: loading and the quantize
command both read it)."""

import json
import os


def read_quantization_config(path: str) -> dict | None:
    """The `quantization_config` object of `path`'s config.json, or None (not a local folder, or not quantized)."""
    config_file = os.path.join(str(path), "config.json")
    if not os.path.isfile(config_file):
        return None
    with open(config_file) as f:
        return json.load(f).get("quantization_config")
