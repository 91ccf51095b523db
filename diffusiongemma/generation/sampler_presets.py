"""Named sampler presets: for each built-in sampler, the setting with the best measured trade-off between solve rate
and denoising passes on the bundled Sudoku model (`benchmarks/samplers.py`, table in docs/samplers.md).

The rule, applied by the benchmark to its grid (it prints the presets it would ship): among one sampler's
settings, keep those whose solve rate is within one binomial standard error of that sampler's best, then take the
one with the fewest mean passes. A preset is a starting point measured on one model and task; a text model's best
setting can differ (the same benchmark's tokens-per-forward column shows how aggressive each one is).

    model.generate(ids, sampler_config=diffusiongemma.sampler_preset("block-refinement"))
    diffusiongemma generate ... --sampler-preset block-refinement [--sampler-setting threshold=0.9]
    POST /v1/completions {"sampler_preset": "block-refinement", ...}
"""

import copy
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from ..sampler_configs import EntropyBoundSamplerConfig
from .block_refinement import BlockRefinementSamplerConfig
from .confidence_threshold import ConfidenceThresholdSamplerConfig
from .discrete_ddim import DiscreteDDIMSamplerConfig
from .sampler_settings import SamplerSettingError


class PresetTable(Mapping):
    """A read-only name -> sampler config table whose every lookup returns a fresh copy: a caller that changes the
    config it got (`SAMPLER_PRESETS["block-refinement"].threshold = 0.1`) changes only its own copy, and the table
    itself has no item assignment or deletion."""

    def __init__(self, presets: dict):
        self._presets = MappingProxyType(dict(presets))

    def __getitem__(self, name: str):
        return copy.deepcopy(self._presets[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._presets)

    def __len__(self) -> int:
        return len(self._presets)

    def __repr__(self) -> str:
        return f"PresetTable({dict(self._presets)!r})"


# name -> config; measured with `python benchmarks/samplers.py --puzzles 1000` (docs/samplers.md)
SAMPLER_PRESETS: Mapping[str, object] = PresetTable({
    "entropy-bound": EntropyBoundSamplerConfig(entropy_bound=0.5),
    "block-refinement": BlockRefinementSamplerConfig(threshold=0.95, greedy=True),
    "confidence-threshold": ConfidenceThresholdSamplerConfig(threshold=0.9, factor=0.5),
    "discrete-ddim": DiscreteDDIMSamplerConfig(),
})


def sampler_preset(name: str, field: str = "sampler_preset"):
    """A fresh copy of the preset `name` (a sampler config for `generate(sampler_config=...)`).

    Raises:
        SamplerSettingError (a ValueError): an unknown name; the message lists the presets, `field` names the
            argument (the CLI flag's or the request field's name).
    """
    if not isinstance(name, str) or name not in SAMPLER_PRESETS:
        raise SamplerSettingError(field, f"unknown sampler preset {name!r}; presets: {', '.join(SAMPLER_PRESETS)}")
    return SAMPLER_PRESETS[name]
