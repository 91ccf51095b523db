"""Synthetic Orbax checkpoints in the release's tree layout (spec G), written by orbax-checkpoint itself.

`orbax_tree_from_state_dict` runs the rule table backwards on a Hugging Face state dict (a tiny random model in the
tests, the docs' walkthrough), so converting the result must give that state dict back exactly. `random_orbax_tree`
fills every source array with random numbers for a config of any size (the memory benchmark). The self-conditioner
and the projector go under `transformer/` (their real location is unconfirmed, spec I; the converter finds them by
name anywhere).
"""

import os

import numpy as np

from .rules import PlannedTensor, expand_rules, source_part_from_target

__all__ = ["orbax_tree_from_state_dict", "random_orbax_tree", "write_orbax_checkpoint"]


def _source_path(item: PlannedTensor) -> str:
    node = "transformer/" + item.node[2:] if item.node.startswith("*/") else item.node
    return f"{node}/{item.leaf}"


def _nest(arrays: dict) -> dict:
    tree: dict = {}
    for path, value in arrays.items():
        node = tree.setdefault("params", {})
        *parents, leaf = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def orbax_tree_from_state_dict(state_dict: dict, config, text_only: bool = False, dtype: str = "float32") -> dict:
    """The nested `{"params": {"transformer": ...}}` tree whose conversion gives `state_dict` back.

    Args:
        state_dict: Hugging Face tensors (torch or NumPy) by key, as `model.state_dict()` of our class or the
            built-in one (tied copies are ignored). config: the model's DiffusionGemmaConfig.
        text_only: leave out the vision tower and projector. dtype: stored dtype, "float32" or "bfloat16".
    Raises:
        ValueError: two keys that share one Orbax array differ (the encoder and decoder `layer_scalar` of a layer).
    """
    arrays: dict[str, np.ndarray] = {}
    written: dict[tuple, str] = {}
    for item in expand_rules(config, text_only):
        value = state_dict[item.key]
        value = value.detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value, np.float32)
        path = _source_path(item)
        target = arrays.setdefault(path, np.zeros(item.source_shape, np.float32))
        part = source_part_from_target(item, value)
        earlier = written.setdefault((path, item.select), item.key)
        if earlier != item.key and not np.array_equal(target[item.select], part):
            raise ValueError(f"{earlier} and {item.key} differ, but both come from params/{path} (the release "
                             "stores one array for both, spec B.2): give them equal values")
        target[item.select] = part
    return _nest({path: array.astype(_numpy_dtype(dtype)) for path, array in arrays.items()})


def random_orbax_tree(config, seed: int = 0, dtype: str = "bfloat16", text_only: bool = False) -> dict:
    """Every source array of `config` filled with N(0, 0.02) (norm scales around 1), stored as `dtype`."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for item in expand_rules(config, text_only):
        path = _source_path(item)
        if path in arrays:
            continue
        value = rng.standard_normal(item.source_shape, dtype=np.float32) * 0.02
        if "norm" in path or "scale" in path:
            value += 1.0
        arrays[path] = value.astype(_numpy_dtype(dtype))
    return _nest(arrays)


def write_orbax_checkpoint(tree: dict, directory, chunk_bytes: int | None = None) -> None:
    """Save `tree` with orbax-checkpoint's PyTreeCheckpointer (as the release was saved); `directory` must not
    exist yet.

    Args:
        chunk_bytes: store arrays in chunks of at most this many bytes (`SaveArgs(chunk_byte_size=...)`), as a
            sharded multi-device save stores one chunk per shard; None: one chunk per array (a single-host save).
    """
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:
        from .orbax import INSTALL_HINT

        raise ImportError(f"writing an Orbax checkpoint needs orbax-checkpoint ({error}); install it with: "
                          f"{INSTALL_HINT}") from None
    checkpointer = ocp.PyTreeCheckpointer()
    save_args = None
    if chunk_bytes is not None:
        import jax

        save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(chunk_byte_size=int(chunk_bytes)), tree)
    checkpointer.save(os.path.abspath(directory), tree, save_args=save_args)  # Orbax wants absolute paths
    checkpointer.close()
