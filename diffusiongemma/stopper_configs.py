"""Stopper configs by name: what `generation_config.json`'s `stopper_config` (`{"_cls_name": ..., fields}`) loads into.

A bottom-layer module (of ours it imports only `config_registry.py`), so the generation config can load a registered stopper config
without importing the stoppers. `generation.stopping.register_stopper` registers a config class here as well. Without a
`stopper_config` a run uses the built-in stable-and-confident stopper, set by the generation config's own
`stability_threshold` and `confidence_threshold`.
"""

from .config_registry import ConfigRegistry

__all__ = ["register_stopper_config", "stopper_config_class", "stopper_config_names"]

_REGISTRY = ConfigRegistry("stopper", "register_stopper")


def register_stopper_config(config_class: type) -> None:
    """Make `config_class` loadable by its class name (see `ConfigRegistry.register`)."""
    _REGISTRY.register(config_class)


def stopper_config_class(name: str) -> type:
    """The registered class called `name`, or a ValueError naming the registered ones."""
    return _REGISTRY.lookup(name)


def stopper_config_names() -> list[str]:
    return _REGISTRY.names()
