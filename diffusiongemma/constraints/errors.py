"""The one error type of constrained decoding."""


class ConstraintError(ValueError):
    """A constraint that cannot be used: a malformed regex or schema, an unsupported schema keyword, text the
    tokenizer cannot spell, or a language no answer can satisfy. The message names which."""
