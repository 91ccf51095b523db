"""A request's constraint: OpenAI's `response_format` (`json_schema`, `json_object`, `text`) or the extra `regex`
field, read and checked (a bad one is a 400 naming its field), then compiled over the server's tokenizer in a worker
thread (`compile_off_loop`: the event loop keeps serving), within the compile budget, and cached.

    {"response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": {...}}}}
    {"response_format": {"type": "json_object"}}      any JSON object
    {"regex": "[0-9]{3}-[0-9]{4}"}                     (extra body field)
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ..constraints import ConstraintError, JsonSchema, Regex, compile_constraint
from .settings import BadRequestField

FORMAT_TYPES = ("text", "json_object", "json_schema")
# the threads that wait for compilations (each runs in a child process within its budget: constraints/budget.py)
COMPILER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="constraint-compile")


def request_constraint(body: dict) -> tuple[object, str | None]:
    """(the `Regex` / `JsonSchema` a request asks for, or None; the body field that asked for it).

    Raises:
        BadRequestField: a malformed `response_format` or `regex`, both given, a schema keyword that cannot be
            enforced, or `stop` strings beside a constraint (cutting at one would leave the answer incomplete).
    """
    constraint, field = read_constraint(body)
    if constraint is not None and body.get("stop"):
        raise BadRequestField("stop", f"cannot be combined with `{field}`: an answer cut at a stop string would not "
                                      "be complete")
    return constraint, field


def read_constraint(body: dict) -> tuple[object, str | None]:
    """`request_constraint` without the `stop` check."""
    fmt, regex = body.get("response_format"), body.get("regex")
    if fmt is not None and regex is not None:
        raise BadRequestField("regex", "give `regex` or `response_format`, not both")
    if regex is not None:
        if not isinstance(regex, str):
            raise BadRequestField("regex", f"must be a string, got {regex!r}")
        try:
            return Regex(regex), "regex"
        except ConstraintError as error:
            raise BadRequestField("regex", str(error)) from None
    if fmt is None:
        return None, None
    if not isinstance(fmt, dict) or fmt.get("type") not in FORMAT_TYPES:
        raise BadRequestField("response_format", f"`type` must be one of {list(FORMAT_TYPES)}, got {fmt!r}")
    if fmt["type"] == "text":
        return None, None
    if fmt["type"] == "json_object":
        return JsonSchema({"type": "object"}), "response_format"
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise BadRequestField("response_format", "`json_schema` must be an object with a `schema` object (and a "
                                                 "`name`)")
    try:
        return JsonSchema(spec["schema"]), "response_format"
    except ConstraintError as error:
        raise BadRequestField("response_format", str(error)) from None


async def compile_off_loop(settings, tokenizer, vocab_size: int):
    """`compiled_constraint` in a worker thread, so the event loop keeps serving while a schema compiles (up to the
    compile budget: 60 s, 4 GiB by default)."""
    if settings.constraint is None:
        return None
    return await asyncio.get_running_loop().run_in_executor(COMPILER, compiled_constraint, settings, tokenizer,
                                                            vocab_size)


def compiled_constraint(settings, tokenizer, vocab_size: int):
    """Compile `settings.constraint` over the server's tokenizer (cached), or None without one.

    Raises:
        BadRequestField: the constraint cannot be compiled (malformed, unspellable, unsatisfiable) or there is no
            pad id.
    """
    if settings.constraint is None:
        return None
    config = settings.config
    pad = config.pad_token_id if config.pad_token_id is not None else getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise BadRequestField(settings.constraint_field, "this server's model has no pad token id, which a "
                                                         "constrained answer needs after its end")
    eos = config.eos_token_id
    eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    try:
        return compile_constraint(settings.constraint, tokenizer, vocab_size, eos_ids, pad)
    except ConstraintError as error:
        raise BadRequestField(settings.constraint_field, str(error)) from None
