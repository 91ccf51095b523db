"""Config classes by name: the one table behind `sampler_configs.py` and `stopper_configs.py`.

A bottom-layer module (it imports nothing of ours). A saved `generation_config.json` names a sampler or stopper config
as `{"_cls_name": ..., fields}`; loading it looks the class up here, so the config can be read without importing the
samplers or stoppers themselves.
"""


class ConfigRegistry:
    """Config classes of one kind ("sampler", "stopper"), keyed by class name."""

    def __init__(self, kind: str, register_with: str, initial: dict[str, type] | None = None):
        self.kind = kind  # used in messages: "a sampler config class needs ..."
        self.register_with = register_with  # the public function users call, named in messages
        self._classes: dict[str, type] = dict(initial or {})

    def register(self, config_class: type) -> None:
        """Make `config_class` loadable by its class name. It needs `to_dict()` returning its fields plus
        `_cls_name` (a dataclass like transformers' `EntropyBoundSamplerConfig`), so it round-trips through save and
        load."""
        if not isinstance(config_class, type) or not callable(getattr(config_class, "to_dict", None)):
            raise TypeError(f"a {self.kind} config class needs a `to_dict()` method (fields plus `_cls_name`), got "
                            f"{config_class!r}")
        known = self._classes.get(config_class.__name__)
        if known is not None and known is not config_class:
            raise ValueError(f"another {self.kind} config class is registered as {config_class.__name__!r} "
                             f"({known.__module__}); give yours another name")
        self._classes[config_class.__name__] = config_class

    def lookup(self, name: str) -> type:
        """The registered class called `name`, or a ValueError naming the registered ones."""
        if name not in self._classes:
            raise ValueError(f"`{self.kind}_config._cls_name` {name!r} is not a registered {self.kind} config "
                             f"(registered: {self.names()}; register yours with diffusiongemma.{self.register_with} "
                             "before loading)")
        return self._classes[name]

    def names(self) -> list[str]:
        return sorted(self._classes)
