"""A tiny tokenizer whose chat template renders tools, tool calls and tool results the way Gemma 4's does (its
markers are special tokens, a string argument sits between two `<|"|>`, keys are bare), and the tools the tool tests
call. Shared by tests/constraints/test_tools.py and tests/serving/test_serve_tools.py."""

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

MARKERS = ["<|tool_call>", "<tool_call|>", '<|"|>', "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>",
           "<|turn>", "<turn|>"]

# `fmt` writes a value as Gemma 4's template does: strings in <|"|>, bare keys, no spaces
TOOL_TEMPLATE = """
{%- macro fmt(v) -%}
{%- if v is string -%}<|"|>{{ v }}<|"|>
{%- elif v is boolean -%}{{ 'true' if v else 'false' }}
{%- elif v is none -%}null
{%- elif v is mapping -%}{ {%- for k, x in v.items() -%}{{ k }}:{{ fmt(x) }}{{ ',' if not loop.last }}{%- endfor -%} }
{%- elif v is sequence -%}[{%- for x in v -%}{{ fmt(x) }}{{ ',' if not loop.last }}{%- endfor -%}]
{%- else -%}{{ v }}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}<|turn>system:
{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}
<|tool>declaration:{{ f.name }}{{ fmt({'description': f.description or '', 'parameters': f.parameters or {}}) }}<tool|>
{%- endfor -%}<turn|>
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}<|turn>model:{{ m.content if m.content is string else '' }}
{%- for c in (m.tool_calls or []) -%}<|tool_call>call:{{ c.function.name }}{{ fmt(c.function.arguments) }}<tool_call|>
{%- endfor -%}<turn|>
{%- elif m.role == 'tool' -%}<|tool_response>response:
{%- for p in messages -%}{%- for c in (p.tool_calls or []) -%}{%- if c.id == m.tool_call_id -%}{{ c.function.name }}
{%- endif -%}{%- endfor -%}{%- endfor -%}{value:<|"|>{{ m.content }}<|"|>}<tool_response|>
{%- else -%}<|turn>{{ 'system' if m.role in ('system', 'developer') else 'user' }}:{{ m.content }}<turn|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|turn>model:{%- endif -%}
"""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "units": {"enum": ["C", "F"]}},
            "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "book", "description": "Book a table",
        "parameters": {"type": "object", "properties": {
            "party": {"type": "object", "properties": {
                "size": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 9},
                "names": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}},
                "required": ["size"]},
            "time": {"type": "number", "minimum": -1, "maximum": 23},
            "vegan": {"type": "boolean"}},
            "required": ["party", "time"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]


def tool_tokenizer(vocab_size: int = 128) -> PreTrainedTokenizerFast:
    """Character-level: ids 0-3 <pad> <eos> <bos> <unk>, printable ASCII, the Gemma 4 markers (special), fillers."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + [chr(c) for c in range(32, 127)] + MARKERS)}
    for i in range(len(vocab), vocab_size):
        vocab[f"<x{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", padding_side="left")
    fast.chat_template = TOOL_TEMPLATE
    return fast
