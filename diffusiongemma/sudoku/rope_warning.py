"""Silence one misleading transformers warning about the Sudoku model's RoPE `factor`.

The "base3" layout (`train.sudoku_rope`) sets `factor` on "proportional" RoPE. Both implementations read it (ours in
`modeling/rope.py`, transformers' `_compute_proportional_rope_parameters` divides the frequencies by it), but
transformers' config validator does not list it among that type's keys and warns "Unrecognized keys in
`rope_parameters` for 'rope_type'='proportional': {'factor'}" every time such a config is built. The filter below
drops exactly that message; every other warning, including other unrecognized keys, still shows.
"""

import logging

from transformers.utils import logging as hf_logging

_MESSAGE = "Unrecognized keys in `rope_parameters` for 'rope_type'='proportional': {'factor'}"


class _DropProportionalFactorWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _MESSAGE


def install() -> None:
    """Attach the filter to transformers' RoPE logger (idempotent)."""
    logger = hf_logging.get_logger("transformers.modeling_rope_utils")
    if not any(isinstance(f, _DropProportionalFactorWarning) for f in logger.filters):
        logger.addFilter(_DropProportionalFactorWarning())
