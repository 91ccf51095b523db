"""A request's stopper: `stopper` (a registered plug-in stopper's config class name, or "stable-and-confident" for
the built-in) and `stopper_settings`, one JSON object of the plug-in stopper's settings
(`{"stopper": "PatienceStopperConfig", "stopper_settings": {"patience": 3}}`), checked by its config class. Without
`stopper` the server's own runs (the model's `generation_config.stopper_config`, else the built-in), and
`stopper_settings` adjust it. The built-in is set by the body fields `stability_threshold` and
`confidence_threshold`. A name or setting that does not apply is a 400 naming the field.
"""

from ..generation.sampler_settings import SamplerSettingError, sampler_config_from
from ..generation_config import BUILTIN_STOPPER_FIELDS
from ..stopper_configs import stopper_config_class, stopper_config_names
from .sampler_request import settings_object


BUILTIN_STOPPER = "stable-and-confident"


def request_stopper_config(present: dict, current, bad_request):
    """The stopper config a request runs with: the one it names (`stopper`) or `current` (the server's plug-in
    stopper config, or None for the built-in), with the request's `stopper_settings` applied.

    Args:
        present: the request body's non-null fields.
        bad_request: `(field, message) -> Exception`, raised for a bad field.
    """
    settings = settings_object(present, "stopper_settings", bad_request)
    name = present.get("stopper")
    if name == BUILTIN_STOPPER:
        current = None
    elif name is not None:
        named = stopper_config_class(name) if isinstance(name, str) and name in stopper_config_names() else None
        if named is None:
            known = ", ".join([BUILTIN_STOPPER, *stopper_config_names()])
            raise bad_request("stopper", f"unknown stopper {name!r}; known: {known}")
        if type(current) is not named:
            current = named  # a class: its defaults, below
    if current is None:
        if settings:
            raise bad_request("stopper_settings", "the built-in stopper takes "
                                                  f"{' and '.join(f'`{n}`' for n in BUILTIN_STOPPER_FIELDS)} as body "
                                                  "fields, not `stopper_settings`")
        return None
    config_class, base = (current, None) if isinstance(current, type) else (type(current), current)
    built_in = [n for n in BUILTIN_STOPPER_FIELDS if n in present]
    if built_in:
        raise bad_request(built_in[0], f"sets the built-in stopper, but this request runs the {config_class.__name__} "
                                       "stopper: send its settings in `stopper_settings`")
    if base is not None and not settings:
        return base
    try:
        return sampler_config_from(config_class, settings, base, kind="stopper")
    except SamplerSettingError as error:
        raise bad_request(f"stopper_settings.{error.field}" if error.field in settings else "stopper",
                          str(error)) from None
