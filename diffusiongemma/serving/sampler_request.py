"""A request's sampler: `sampler` (a name, docs/samplers.md) or `sampler_preset` (a named preset), plus that
sampler's settings, either in the one `sampler_settings` object (any sampler, plug-ins included:
`{"sampler": "TopConfidenceSamplerConfig", "sampler_settings": {"keep": 8}}`) or, for the built-in samplers, as body
fields (`{"sampler": "block-refinement", "threshold": 0.9}`). Without either name, settings adjust the server's own
sampler (the model's `generation_config`). The sampler's config class checks every value. A setting of another
sampler, an unknown name or a bad value is a 400 naming the field (`sampler_settings.keep` for one sent in the object).
"""

import dataclasses

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
    own = setting_names(config_class) if dataclasses.is_dataclass(config_class) else []
    for field in SAMPLER_FIELDS:
        if field in present and field not in own:
            owners = [n for n, cls in SAMPLER_NAMES.items() if field in setting_names(cls)]
            raise bad_request(field, f"is a setting of the {' / '.join(owners)} sampler, not of "
                                     f"{sampler_name(config_class)}; pass `sampler` to choose one")
    settings = {k: present[k] for k in own if k in present}
    nested = settings_object(present, "sampler_settings", bad_request)
    twice = sorted(set(nested) & set(settings))
    if twice:
        raise bad_request(f"sampler_settings.{twice[0]}", f"is also sent as the body field `{twice[0]}`: send it once")
    settings.update(nested)
    if name is None and not settings:
        return current  # the server's own, or the preset
    try:
        return sampler_config_from(config_class, settings, current)
    except SamplerSettingError as error:
        raise bad_request(f"sampler_settings.{error.field}" if error.field in nested else error.field,
                          str(error)) from None


def settings_object(present: dict, field: str, bad_request) -> dict:
    """The JSON object of settings in body field `field` ({} when absent)."""
    value = present.get(field, {})
    if not isinstance(value, dict):
        raise bad_request(field, f"must be a JSON object of settings (name: value), got {value!r}")
    return value
