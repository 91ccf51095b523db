"""Match the expanded rule table against the arrays an Orbax checkpoint actually holds (spec G), before any data
is read: every expected array found, every shape as the config says, nothing left over.

All problems are collected and reported together (`ConversionError.problems`), each naming the Orbax path, the
expected and the found shape, so one run shows everything that is wrong with a checkpoint or a config.
"""

import re
from dataclasses import dataclass

from .orbax import OrbaxCheckpoint
from .rules import PlannedTensor

__all__ = ["ConversionError", "ConversionPlan", "match_checkpoint"]

ANY_LEAF = ("w", "scale")  # einsum and norm leaf names are conventional, not checked (spec G)
VISION_PATH = re.compile(r"(^|/)(vision_encoder|mm_input_projection)(/|$)")
TEXT_LAYER = re.compile(r"^transformer/layer_(\d+)/")
SHOWN = 40


class ConversionError(ValueError):
    """The checkpoint does not fit the config (or the rules); `problems` lists every mismatch, one line each."""

    def __init__(self, headline: str, problems: list[str]):
        self.headline, self.problems = headline, list(problems)
        shown = "\n".join(f"  - {p}" for p in self.problems[:SHOWN])
        more = f"\n  ... and {len(self.problems) - SHOWN} more" if len(self.problems) > SHOWN else ""
        super().__init__(f"{headline} ({len(self.problems)} problem(s)):\n{shown}{more}")


@dataclass
class ConversionPlan:
    """Planned tensors and, for each, the checkpoint path of its source array (below `params/`)."""

    tensors: list[PlannedTensor]
    sources: dict  # PlannedTensor.key -> array path

    def reads_per_source(self) -> dict:
        counts = {}
        for item in self.tensors:
            counts[self.sources[item.key]] = counts.get(self.sources[item.key], 0) + 1
        return counts


def _resolve(node: str, leaf: str, paths: set, children: dict) -> tuple[str | None, list[str]]:
    """The checkpoint path for rule node/leaf, or None; second item: ambiguous candidates (for the message)."""
    if node.startswith("*/"):
        suffix = node[2:]
        nodes = [n for n in children if n == suffix or n.endswith("/" + suffix)]
        found = [f"{n}/{leaf}" for n in nodes if f"{n}/{leaf}" in paths]
        if not found and leaf in ANY_LEAF:
            found = [f"{n}/{children[n][0]}" for n in nodes if len(children[n]) == 1]
        return (found[0], []) if len(found) == 1 else (None, found)
    exact = f"{node}/{leaf}"
    if exact in paths:
        return exact, []
    if leaf in ANY_LEAF and len(children.get(node, [])) == 1:
        return f"{node}/{children[node][0]}", []
    return None, []


def _layer_count_problems(paths: set, config, text_only: bool, vision_layers: int | None) -> list[str]:
    problems = []
    layers = sorted({int(m.group(1)) for p in paths if (m := TEXT_LAYER.match(p))})
    expected = config.text_config.num_hidden_layers
    if layers and len(layers) != expected:
        problems.append(f"the checkpoint has {len(layers)} text layers (transformer/layer_{layers[0]} .. "
                        f"layer_{layers[-1]}), the config says text_config.num_hidden_layers = {expected}")
    if not text_only and vision_layers is not None and vision_layers != config.vision_config.num_hidden_layers:
        problems.append(f"the checkpoint's vision tower has {vision_layers} stacked layers, the config says "
                        f"vision_config.num_hidden_layers = {config.vision_config.num_hidden_layers}")
    return problems


def match_checkpoint(checkpoint: OrbaxCheckpoint, planned: list[PlannedTensor], config, text_only: bool = False,
                     allow_unused: bool = False, raise_on_problems: bool = True) -> tuple[ConversionPlan, list[str]]:
    """Find each planned tensor's source array and check its shape and dtype.

    Args:
        checkpoint: the open Orbax checkpoint. planned: `expand_rules(config, text_only)`.
        text_only: vision arrays in the checkpoint are skipped, not reported as unused.
        allow_unused: arrays that no rule converts are skipped instead of being an error.
        raise_on_problems: raise ConversionError (True) or return the problems (False, for `verify`).
    Returns:
        (plan, problems).
    """
    paths = set(checkpoint.paths())
    children: dict[str, list[str]] = {}
    for path in sorted(paths):
        node, _, leaf = path.rpartition("/")
        children.setdefault(node, []).append(leaf)
    problems, sources, used = [], {}, set()
    checked: dict[str, tuple] = {}
    vision_layers = None
    for item in planned:
        path, ambiguous = _resolve(item.node, item.leaf, paths, children)
        if path is None:
            where = f"any path ending in {item.node[2:]}/{item.leaf}" if item.node.startswith("*/") else \
                item.orbax_path
            reason = f"several arrays match ({', '.join(ambiguous)})" if ambiguous else "missing array"
            problems.append(f"{reason}: {where} (needed for {item.key}, shape {item.source_shape})")
            continue
        sources[item.key] = path
        used.add(path)
        if path in checked:
            continue
        info = checkpoint.array(path)
        checked[path] = info.shape
        if "stacked_layers" in path and info.shape:
            vision_layers = info.shape[0]
        if info.shape != item.source_shape:
            problems.append(f"params/{path}: expected shape {item.source_shape} (from the config), found "
                            f"{info.shape}")
        if info.dtype.kind != "f" and str(info.dtype) != "bfloat16":
            problems.append(f"params/{path}: expected a floating-point array, found dtype {info.dtype}")
    problems = _layer_count_problems(paths, config, text_only, vision_layers) + problems
    unused = sorted(p for p in paths - used if not (text_only and VISION_PATH.search(p)))
    if unused and not allow_unused:
        problems.append(f"{len(unused)} array(s) that no rule converts (pass --allow-unused to skip them): "
                        + ", ".join(f"params/{p}" for p in unused[:20]) + (" ..." if len(unused) > 20 else ""))
    if problems and raise_on_problems:
        raise ConversionError(f"the Orbax checkpoint {checkpoint.directory} does not fit the config", problems)
    return ConversionPlan([t for t in planned if t.key in sources], sources), problems
