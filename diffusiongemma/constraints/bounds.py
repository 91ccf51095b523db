"""Numeric bounds of a JSON schema as regular expressions: `minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum` and `multipleOf`, which outlines-core's schema-to-regex ignores.

The decimal integers of a range are a regular language: `integer_range_regex(lo, hi)` writes it (canonical
spellings only: no leading zeros, no `-0`). A `number` with whole-number bounds is a union of three such ranges (an
integer; a non-negative integer part plus a fraction; a negative integer part plus a fraction) with fractions that
end in a non-zero digit, so `3.0` is written `3` and every spelled value is strictly inside its integer part's unit
interval. Bounds a regex cannot express exactly (a non-whole bound on a `number`, `multipleOf` on a `number` or with
too many multiples in range) are refused by name.

`with_bound_markers(schema)` swaps each bounded node for a `const` of a unique marker integer that outlines-core
copies into its regex verbatim; `replace_markers` then puts each node's own regex in its place.
"""

import math

from .errors import ConstraintError

BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
MAX_MULTIPLES = 1000  # multipleOf is written as the list of its multiples in range, at most this many
FRACTION = r"\.[0-9]*[1-9]"  # a fraction strictly between 0 and 1 (no trailing zeros)
MARKER_BASE = 7302958164000000000  # marker i is MARKER_BASE + i: 19 digits no schema is likely to hold


def digits_between(low: str, high: str) -> str:
    """Regex of the digit strings of len(low) == len(high) between `low` and `high` (inclusive, as numbers)."""
    if not low:
        return ""
    if low[0] == high[0]:
        return low[0] + digits_between(low[1:], high[1:])
    n = len(low) - 1
    if low[1:] == "0" * n and high[1:] == "9" * n:
        return f"[{low[0]}-{high[0]}]" + (f"[0-9]{{{n}}}" if n else "")
    parts = [low[0] + digits_between(low[1:], "9" * n)]
    if int(high[0]) - int(low[0]) > 1:
        parts.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}]" + (f"[0-9]{{{n}}}" if n else ""))
    parts.append(high[0] + digits_between("0" * n, high[1:]))
    return "(?:" + "|".join(parts) + ")"


def natural_range_regex(lo: int, hi: int | None) -> str | None:
    """Regex of the canonical decimals of lo..hi (0 <= lo; hi None: no upper end), None when the range is empty."""
    if hi is not None and hi < lo:
        return None
    parts = []
    n = len(str(lo))
    top = hi if hi is not None else 10 ** n - 1
    while True:
        first = max(lo, 10 ** (n - 1) if n > 1 else 0)
        last = min(top, 10 ** n - 1)
        if first <= last:
            parts.append(digits_between(str(first), str(last)))
        if last == top:
            break
        n += 1
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(str(lo))},}}")  # every longer number
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def integer_range_regex(lo: int | None, hi: int | None) -> str | None:
    """Regex of the canonical JSON spellings of the integers lo..hi (None: unbounded on that side), or None when
    the range is empty. `-0` and leading zeros are never matched."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(natural_range_regex(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # the negatives lo..min(hi, -1) are '-' and the magnitudes
        magnitudes = natural_range_regex(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)
        if magnitudes is not None:
            parts.append("-" + magnitudes)
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def bound_value(node: dict, key: str, where: str):
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConstraintError(f"JsonSchema: {where}.{key} must be a finite number, got {value!r}")
    return value


def integer_bounds(node: dict, where: str) -> tuple[int | None, int | None]:
    """The inclusive integer range the node's four bound keywords allow (exact for any real bounds)."""
    lo = hi = None
    if "minimum" in node:
        lo = math.ceil(bound_value(node, "minimum", where))
    if "exclusiveMinimum" in node:
        value = math.floor(bound_value(node, "exclusiveMinimum", where)) + 1
        lo = value if lo is None else max(lo, value)
    if "maximum" in node:
        hi = math.floor(bound_value(node, "maximum", where))
    if "exclusiveMaximum" in node:
        value = math.ceil(bound_value(node, "exclusiveMaximum", where)) - 1
        hi = value if hi is None else min(hi, value)
    return lo, hi


def integer_regex(node: dict, where: str) -> str:
    """The regex of a bounded `integer` node."""
    lo, hi = integer_bounds(node, where)
    if "multipleOf" in node:
        step = bound_value(node, "multipleOf", where)
        if step <= 0 or step != int(step):
            raise ConstraintError(f"JsonSchema: {where}.multipleOf on an integer must be a positive whole number, got "
                                  f"{step!r}")
        step = int(step)
        if step != 1:
            if lo is None or hi is None or (hi // step - math.ceil(lo / step)) >= MAX_MULTIPLES:
                raise ConstraintError(f"JsonSchema: unsupported keyword 'multipleOf' at {where}.multipleOf: it is "
                                      f"enforced only with both bounds and at most {MAX_MULTIPLES} multiples between "
                                      "them")
            values = range(-(-lo // step) * step, hi + 1, step)
            if not values:
                raise ConstraintError(f"JsonSchema: no integer satisfies the bounds and multipleOf at {where}")
            return "(?:" + "|".join(str(v) for v in values) + ")"
    regex = integer_range_regex(lo, hi)
    if regex is None:
        raise ConstraintError(f"JsonSchema: no integer satisfies the bounds at {where} ({lo}..{hi})")
    return regex


def number_regex(node: dict, where: str) -> str:
    """The regex of a bounded `number` node: whole-number bounds only (a fraction is strictly inside the unit
    interval of its integer part, so a whole bound splits the ranges exactly)."""
    if "multipleOf" in node:
        raise ConstraintError(f"JsonSchema: unsupported keyword 'multipleOf' at {where}.multipleOf: enforced on "
                              "integers only")
    for key in BOUND_KEYWORDS[:4]:
        if key in node and bound_value(node, key, where) != int(node[key]):
            raise ConstraintError(f"JsonSchema: unsupported bound {key}={node[key]!r} at {where}.{key}: a number's "
                                  "bounds must be whole numbers to be enforced exactly (use an integer schema, or "
                                  "scale the unit)")
    lo = hi = None  # value bounds (inclusiveness only matters for the integer spellings)
    for key, kind in (("minimum", "lo"), ("exclusiveMinimum", "lo"), ("maximum", "hi"), ("exclusiveMaximum", "hi")):
        if key in node:
            value = int(node[key])
            if kind == "lo":
                lo = value if lo is None else max(lo, value)
            else:
                hi = value if hi is None else min(hi, value)
    int_lo, int_hi = integer_bounds(node, where)
    parts = [integer_range_regex(int_lo, int_hi)]
    # x = I + f (I >= 0, 0 < f < 1) lies in (I, I + 1): inside when lo <= I and I + 1 <= hi
    whole = natural_range_regex(max(lo, 0) if lo is not None else 0, hi - 1 if hi is not None else None)
    parts.append(whole + FRACTION if whole is not None else None)
    # x = -(J + f) (J >= 0) lies in (-J - 1, -J): inside when lo <= -J - 1 and -J <= hi
    if lo is None or lo <= -1:
        negative = natural_range_regex(max(-hi, 0) if hi is not None else 0, -lo - 1 if lo is not None else None)
        parts.append("-" + negative + FRACTION if negative is not None else None)
    parts = [p for p in parts if p is not None]
    if not parts:
        raise ConstraintError(f"JsonSchema: no number satisfies the bounds at {where}")
    return "(?:" + "|".join(parts) + ")"


def bounded_regex(node: dict, where: str) -> str:
    """The regex of one node that carries bound keywords (its `type` must be "integer" or "number")."""
    kind = node.get("type")
    if kind not in ("integer", "number"):
        raise ConstraintError(f"JsonSchema: numeric bounds at {where} need `type` \"integer\" or \"number\" there, "
                              f"got {kind!r} (put bounds on the numeric branch of an anyOf)")
    for key in ("enum", "const"):
        if key in node:
            raise ConstraintError(f"JsonSchema: {where} combines {key!r} with numeric bounds: list only the allowed "
                                  "values instead")
    return integer_regex(node, where) if kind == "integer" else number_regex(node, where)


def split_type_list(node: dict) -> dict:
    """A node whose `type` lists a numeric type and others, with bounds, becomes anyOf [the bounded numeric type,
    the others] (bounds apply to numbers only)."""
    kinds = node["type"]
    numeric = "number" if "number" in kinds else "integer"
    rest = [k for k in kinds if k not in ("integer", "number")]
    bounded = {k: v for k, v in node.items() if k in BOUND_KEYWORDS}
    bounded["type"] = numeric
    other = {k: v for k, v in node.items() if k not in BOUND_KEYWORDS}
    other["type"] = rest[0] if len(rest) == 1 else rest
    return {"anyOf": [bounded, other] if rest else [bounded]}


def with_bound_markers(schema, where: str = "schema", markers: dict | None = None):
    """(a copy of `schema` with each bounded node replaced by `{"const": marker}`, {marker text: its regex}).

    Raises:
        ConstraintError: bounds that cannot be enforced, naming their place.
    """
    markers = {} if markers is None else markers
    if not isinstance(schema, dict):
        return schema, markers
    node = schema
    if any(k in node for k in BOUND_KEYWORDS):
        if isinstance(node.get("type"), list):
            node = split_type_list(node)
        else:
            marker = str(MARKER_BASE + len(markers))
            markers[marker] = bounded_regex(node, where)
            return {"const": int(marker)}, markers
    out = {}
    for key, value in node.items():
        here = f"{where}.{key}"
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: with_bound_markers(sub, f"{here}.{name}", markers)[0] for name, sub in value.items()}
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            out[key] = [with_bound_markers(sub, f"{here}[{i}]", markers)[0] for i, sub in enumerate(value)]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = with_bound_markers(value, here, markers)[0]
        else:
            out[key] = value
    return out, markers


def replace_markers(regex: str, markers: dict, source: str) -> str:
    """Put each marker's regex in its place in outlines-core's regex (every copy: a `$ref` may be inlined twice);
    `source` is the schema's own text, which must not hold a marker already."""
    for marker, inner in markers.items():
        if marker in source:
            raise ConstraintError(f"JsonSchema: the schema holds the digits {marker}, which numeric bounds use as a "
                                  "placeholder; change that value")
        regex = regex.replace(marker, f"(?:{inner})")
    return regex
