"""A request's sampler: `sampler` (a name, docs/samplers.md) or `sampler_preset` (a named preset), plus that
sampler's settings as body fields, e.g. `{"sampler": "block-refinement", "threshold": 0.9}`. Without either, setting
fields adjust the server's own sampler (the model's `generation_config`). A setting of another sampler, an unknown
name or a bad value is a 400 naming the field.
"""

from ..generation.sampler_presets import sampler_preset
from ..generation.sampler_settings import (
    SAMPLER_NAMES,
    SamplerSettingError,
    sampler_config_class_named,
    sampler_config_from,
    sampler_name,
    setting_names,
)

# every built-in sampler's settings: the body fields this module reads (handlers.py declares them)
SAMPLER_FIELDS = sorted({name for cls in SAMPLER_NAMES.values() for name in setting_names(cls)})


def request_sampler_config(present: dict, current, bad_request):
    """The sampler config a request asks for (`current` when it names none and sets nothing).

    Args:
        present: the request body's non-null fields.
        current: the server's sampler config (after any legacy `entropy_bound`).
        bad_request: `(field, message) -> Exception`, raised for a bad field.
    """
    name, preset = present.get("sampler"), present.get("sampler_preset")
    try:
        if preset is not None:
            current = sampler_preset(preset)
            if name is not None and sampler_config_class_named(name) is not type(current):
                raise SamplerSettingError("sampler", f"names {name!r}, but sampler_preset {preset!r} is a "
                                                     f"{sampler_name(type(current))} preset; give one of them")
        config_class = type(current) if name is None else sampler_config_class_named(name)
    except SamplerSettingError as error:
        raise bad_request(error.field, str(error)) from None
    own = set(setting_names(config_class))
    for field in SAMPLER_FIELDS:
        if field in present and field not in own:
            owners = [n for n, cls in SAMPLER_NAMES.items() if field in setting_names(cls)]
            raise bad_request(field, f"is a setting of the {' / '.join(owners)} sampler, not of "
                                     f"{sampler_name(config_class)}; pass `sampler` to choose one")
    settings = {k: present[k] for k in setting_names(config_class) if k in present}
    if name is None and not settings:
        return current  # the server's own, or the preset
    try:
        return sampler_config_from(config_class, settings, current)
    except SamplerSettingError as error:
        raise bad_request(error.field, str(error)) from None
