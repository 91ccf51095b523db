"""Exact regular expressions for the string formats a `JsonSchema` may name, used instead of outlines-core's own.

outlines-core's `date` accepts 2023-02-31, its `date-time` and `time` leave the UTC offset optional (RFC 3339
requires one), and its `email` and `uri` may put `"` or `\\` inside the JSON string unescaped. Each regex here
matches only text that is a valid value of its format and that needs no escaping inside a JSON string (no `"`,
`\\` or control characters), so the answer stays JSON. Digits are `[0-9]` (the Rust regex `\\d` is any Unicode
digit).
"""

DIGIT = "[0-9]"
# years 0001-9999 (Python's `date.fromisoformat`, which jsonschema's check uses, has no year 0)
YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
# a leap year: divisible by 4 but not by 100 (the last two digits), or by 400 (the first two; 0000 excluded)
LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"  # 31-day months
             "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"  # 30-day months
             "|02-(?:0[1-9]|1[0-9]|2[0-8]))")  # February outside leap days
DATE = f"(?:{YEAR}-{MONTH_DAY}|{LEAP_YEAR}-02-29)"
# RFC 3339 full-time: hh:mm:ss, optional fraction, and a required offset (no leap second 60: not every checker
# accepts it)
TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
DATE_TIME = f"{DATE}T{TIME}"
UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"  # one DNS label
EMAIL = f"[A-Za-z0-9_%+-]+(?:\\.[A-Za-z0-9_%+-]+)*@{LABEL}(?:\\.{LABEL})+"
URI_CHARS = "[A-Za-z0-9._~%!$&'()*+,;=:@/-]"  # RFC 3986 unreserved, sub-delims, ':', '@', '/' and percent signs
URI = (f"(?:https?|ftp)://{LABEL}(?:\\.{LABEL})*(?::[0-9]{{1,5}})?(?:/{URI_CHARS}*)?(?:\\?(?:{URI_CHARS}|\\?)*)?"
       f"(?:#(?:{URI_CHARS}|\\?)*)?")

FORMAT_REGEX = {"date": DATE, "time": TIME, "date-time": DATE_TIME, "uuid": UUID, "email": EMAIL, "uri": URI}
