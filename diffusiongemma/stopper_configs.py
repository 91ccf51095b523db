"""Stopper configs by name: what `generation_config.json`'s `stopper_config` (`{"_cls_name": ..., fields}`) loads into.

A bottom-layer module (it imports nothing of ours), so the generation config can load a registered stopper config
without importing the stoppers. `generation.stopping.register_stopper` registers a config class here as well. Without a
`stopper_config` a run uses the built-in stable-and-confident stopper, set by the generation config's own
`stability_threshold` and `confidence_threshold`.
"""

__all__ = ["register_stopper_config", "stopper_config_class", "stopper_config_names"]

_CONFIGS: dict[str, type] = {}


def register_stopper_config(config_class: type) -> None:
    """Make `config_class` loadable by its class name. It needs `to_dict()` returning its fields plus `_cls_name`, so
    it round-trips through save and load (as a sampler config does)."""
    if not isinstance(config_class, type) or not callable(getattr(config_class, "to_dict", None)):
        raise TypeError(f"a stopper config class needs a `to_dict()` method (fields plus `_cls_name`), got "
                        f"{config_class!r}")
    known = _CONFIGS.get(config_class.__name__)
    if known is not None and known is not config_class:
        raise ValueError(f"another stopper config class is registered as {config_class.__name__!r} "
                         f"({known.__module__}); give yours another name")
    _CONFIGS[config_class.__name__] = config_class


def stopper_config_class(name: str) -> type:
    """The registered class called `name`, or a ValueError naming the registered ones."""
    if name not in _CONFIGS:
        raise ValueError(f"`stopper_config._cls_name` {name!r} is not a registered stopper config (registered: "
                         f"{sorted(_CONFIGS)}; register yours with diffusiongemma.register_stopper before loading)")
    return _CONFIGS[name]


def stopper_config_names() -> list[str]:
    return sorted(_CONFIGS)
