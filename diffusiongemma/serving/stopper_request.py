"""A request's stopper settings: `stopper_settings`, one JSON object of the server's plug-in stopper's settings
(`{"stopper_settings": {"patience": 3}}`), checked by its config class. The server's stopper is the model's
`generation_config.stopper_config`; without one it is the built-in stable-and-confident stopper, which the body
fields `stability_threshold` and `confidence_threshold` set. A setting that does not apply is a 400 naming the field.
"""

from ..generation.sampler_settings import SamplerSettingError, sampler_config_from
from ..generation_config import BUILTIN_STOPPER_FIELDS
from .sampler_request import settings_object


def request_stopper_config(present: dict, current, bad_request):
    """The stopper config a request runs with: `current` (the server's plug-in stopper config, or None for the
    built-in) with the request's `stopper_settings` applied.

    Args:
        present: the request body's non-null fields.
        bad_request: `(field, message) -> Exception`, raised for a bad field.
    """
    settings = settings_object(present, "stopper_settings", bad_request)
    if current is None:
        if settings:
            raise bad_request("stopper_settings", "this server runs the built-in stopper, which takes "
                                                  f"{' and '.join(f'`{n}`' for n in BUILTIN_STOPPER_FIELDS)} as body "
                                                  "fields")
        return None
    built_in = [n for n in BUILTIN_STOPPER_FIELDS if n in present]
    if built_in:
        raise bad_request(built_in[0], f"sets the built-in stopper, but this server runs the "
                                       f"{type(current).__name__} stopper: send its settings in `stopper_settings`")
    if not settings:
        return current
    try:
        return sampler_config_from(type(current), settings, current, kind="stopper")
    except SamplerSettingError as error:
        raise bad_request(f"stopper_settings.{error.field}", str(error)) from None
