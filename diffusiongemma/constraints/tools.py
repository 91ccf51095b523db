"""`ToolCalls`: a constraint whose answers are function calls in Gemma 4's call syntax (tool_syntax.py), each one's
arguments valid under that function's `parameters` schema.

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}]
    model.generate(ids, constraint=ToolCalls(tools), tokenizer=tok)                 # one or more calls
    ToolCalls(tools, tool_choice={"type": "function", "function": {"name": "get_weather"}})   # that one only
    ToolCalls(tools, tool_choice="auto")    # free text (never a call marker), then optionally calls

`tool_choice` follows OpenAI: "required" (calls of any tool), a named function (calls of it), "auto" (text, then
calls or not: a call, once started, is constrained to be whole and valid), "none" (text without a call marker).
`parallel_tool_calls=False` allows exactly one call.
"""

import json
import re
from dataclasses import dataclass, field

from .errors import ConstraintError
from .spec import JsonSchema
from .tool_syntax import FREE_TEXT, SPECIAL_TEXTS, call_body_regex, calls_regex

CHOICES = ("auto", "none", "required")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class ToolsError(ConstraintError):
    """Bad `tools` or `tool_choice`; `field` names the place (`tools[1].function.name`, `tool_choice`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"`{field}` {message}")
        self.field = field


def check_tools(tools) -> list[dict]:
    """OpenAI `tools` -> [{"name", "description", "parameters"}], each checked.

    Accepts `{"type": "function", "function": {...}}` entries (and the bare function objects).

    Raises:
        ToolsError: not a list, an entry without a function, a name that is not an identifier (or repeated),
            `parameters` that is not an object schema or uses a keyword the constraint cannot enforce.
    """
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ToolsError("tools", f"must be a non-empty list of tools, got {tools!r}"[:300])
    functions, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            function, where = tool["function"], f"{where}.function"
        elif isinstance(tool, dict) and "name" in tool and "type" not in tool:
            function = tool
        else:
            raise ToolsError(where, f"must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}, "
                                    f"got {tool!r}"[:300])
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolsError(f"{where}.name", f"must be an identifier (letters, digits, _; at most 64), got {name!r}")
        if name in seen:
            raise ToolsError(f"{where}.name", f"repeats the tool name {name!r}")
        seen.add(name)
        description = function.get("description", "")
        if not isinstance(description, str):
            raise ToolsError(f"{where}.description", f"must be a string, got {description!r}"[:300])
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise ToolsError(f"{where}.parameters", f"must be a JSON schema of type \"object\", got "
                                                    f"{parameters!r}"[:300])
        try:
            JsonSchema(parameters)  # the keywords and bounds the constraint can enforce
        except ConstraintError as error:
            raise ToolsError(f"{where}.parameters", str(error).replace("JsonSchema: schema", "schema")) from None
        functions.append({"name": name, "description": description, "parameters": parameters})
    return functions


def chosen_names(functions: list[dict], tool_choice) -> tuple[str, list[str]]:
    """(the mode: "auto" / "none" / "required", the function names a call may use).

    Raises:
        ToolsError: an unknown mode, or a named function that is not among the tools.
    """
    names = [f["name"] for f in functions]
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ToolsError("tool_choice", f"must be one of {list(CHOICES)} or {{\"type\": \"function\", "
                                            f"\"function\": {{\"name\": ...}}}}, got {tool_choice!r}")
        return tool_choice, names
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(function, dict)):
        raise ToolsError("tool_choice", f"must be one of {list(CHOICES)} or {{\"type\": \"function\", \"function\": "
                                        f"{{\"name\": ...}}}}, got {tool_choice!r}"[:300])
    if function.get("name") not in names:
        raise ToolsError("tool_choice.function.name", f"names no tool: {function.get('name')!r} (tools: {names})")
    return "required", [function["name"]]


@dataclass(frozen=True)
class ToolCalls:
    """Every answer is function calls in Gemma 4's syntax (or text, with `tool_choice` "auto" / "none"), each
    call's arguments valid under its function's `parameters`. Parse an answer with `parse_tool_calls`.

    Args:
        tools: OpenAI tools, `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
        tool_choice: "required" (default), "auto", "none", or `{"type": "function", "function": {"name": N}}`.
        parallel_tool_calls: allow several calls in one answer (else exactly one, when calls are made).
    """

    tools: list = field(compare=False)
    tool_choice: object = field(default="required", compare=False)
    parallel_tool_calls: bool = True
    text: str = field(init=False, repr=False, compare=True)
    special_texts = SPECIAL_TEXTS  # special tokens the answer may spell (automaton.py reads this)

    def __post_init__(self):
        functions = check_tools(self.tools)
        mode, names = chosen_names(functions, self.tool_choice)
        if not isinstance(self.parallel_tool_calls, bool):
            raise ToolsError("parallel_tool_calls", f"must be true or false, got {self.parallel_tool_calls!r}")
        object.__setattr__(self, "text", json.dumps([functions, mode, names, self.parallel_tool_calls]))

    @property
    def functions(self) -> list[dict]:
        return json.loads(self.text)[0]

    @property
    def mode(self) -> str:
        return json.loads(self.text)[1]

    @property
    def allowed(self) -> list[str]:
        return json.loads(self.text)[2]

    def to_regex(self) -> str:
        functions, mode, names, parallel = json.loads(self.text)
        if mode == "none":
            return FREE_TEXT
        bodies = [call_body_regex(f["name"], f["parameters"], f"tools[{i}].function.parameters")
                  for i, f in enumerate(functions) if f["name"] in names]
        return calls_regex(bodies, parallel, after_text=mode == "auto")

    def describe(self) -> str:
        mode, names = self.mode, self.allowed
        return f"ToolCalls({mode}: {', '.join(names)})"
