"""How a `generate` call runs: its run options (batching, `max_batch_size`, `compile`, `batch_invariant`, the trace)
checked into one `RunOptions` record, and the one capability table that says what each batching mode cannot do.

Modes (every one runs in the row pool, `pool.py`):

    lockstep   all rows admitted together, committing together (lockstep.py)
    slices     lock-step over consecutive slices of `max_batch_size` rows (one after another)
    mixed      every row on its own schedule (mixed.py)
    invariant  mixed, every row alone inside each pass (`batch_invariant=True`, invariant.py)

Choices made for the user (documented at `generate`): with `batching` unset, a sampler that draws per row and more
than one row run "mixed" (compiled or not), unless a streamer or `past_key_values` asks for lock-step;
`batch_invariant=True` runs "invariant"; a global-RNG sampler runs "lockstep". `return_trace` changes nothing: a
trace records the run the call makes without it (mixed traces: one record per row and step, docs/trace-format.md).
Anything else a mode cannot do is refused from `CAPABILITIES`, in one message style.
"""

from dataclasses import dataclass

BATCHING = ("mixed", "lockstep")
COMPILE_OPTIONS = ("mode", "backend")

# feature -> {mode: why it cannot work there}; a mode not listed supports the feature
CAPABILITIES: dict[str, dict[str, str]] = {
    "streamer": {
        "slices": "the slices run one after another, and a streamer follows one batch (one prompt, one end)",
    },
    "past_key_values": {
        "slices": "one cache cannot continue several slices",
    },  # mixed: each row's cache starts from its row of the shared one, unless that holds padding (below)
    "return_trace": {
        "slices": "a trace records one batch, and the slices are several",
    },
    "compile": {
        "invariant": "every row runs alone at the shapes of its solo run, which a pass fixed per row bucket would "
                     "change (the compiled mixed pass batches the rows of a bucket)",
    },
    "a global-RNG sampler": {
        "slices": "it draws from the global RNG in the built-in's order over one batch",
        "mixed": "it draws from the global RNG in the built-in's order over one lock-step batch",
        "invariant": "it draws from the global RNG in the built-in's order over one lock-step batch",
    },
}

MODE_NAMES = {"lockstep": "batching='lockstep'", "slices": "lock-step slices (max_batch_size below the batch)",
              "mixed": "batching='mixed'", "invariant": "batch_invariant=True (which runs batching='mixed')"}
FIXES = {
    "streamer": "drop the streamer, or pass batching='lockstep'",
    "past_key_values": "pass batching='lockstep'",
    "return_trace": "pass batching='lockstep'",
    "compile": "drop batch_invariant=True, or pass compile=False",
    "a global-RNG sampler": "these need sampling='fast' or another sampler that draws per row",
}


PADDED_PREFIX = ("the shared cache holds left padding, and a padded row's cached keys sit at positions shifted by its "
                 "padding (spec C.10), while a mixed row is its own sequence from position 0, without padding: its "
                 "continuation would read its prefix at the wrong distances")


def refuse_padded_prefix(mode: str) -> None:
    """The one refusal that depends on the data, not the mode alone: `past_key_values` whose prefix is left-padded
    (its `attention_mask` part holds a 0), in the table's message style."""
    raise ValueError(f"{MODE_NAMES[mode]} cannot run with past_key_values: {PADDED_PREFIX} (pass batching='lockstep')")


def fix_for(feature: str, mode: str) -> str:
    """What to pass instead: slices are undone by a `max_batch_size` of at least the batch."""
    if mode == "slices" and feature != "a global-RNG sampler":
        return "pass max_batch_size=None, or at least the batch size"
    return FIXES[feature]


def refuse(features: list[str], mode: str) -> None:
    """Raise the one ValueError naming every feature `mode` cannot do, why, and what to pass instead."""
    refused = [f for f in features if mode in CAPABILITIES[f]]
    if refused:
        lines = [f"{f}: {CAPABILITIES[f][mode]} ({fix_for(f, mode)})" for f in refused]
        raise ValueError(f"{MODE_NAMES[mode]} cannot run with " + "; ".join(lines))


@dataclass(frozen=True)
class RunOptions:
    """The checked run options of one `generate` call.

    Attributes:
        mode: "lockstep", "slices", "mixed" or "invariant" (module docstring).
        max_batch_size: rows per pass (mixed: pool slots; slices: rows per slice), or None (the whole batch).
        compile: the `compiled_denoise_pass` options, or None (eager).
        trace_top_k: the top-k width of a trace to record, or None (no trace).
        trace_sc_embedding: the trace keeps the exact self-conditioning input.
    """

    mode: str
    max_batch_size: int | None
    compile: dict | None
    trace_top_k: int | None
    trace_sc_embedding: bool

    @property
    def batching(self) -> str:
        """The batching as the manifest and the pool name it: "lockstep", "chunks" or "mixed"."""
        return {"slices": "chunks", "invariant": "mixed"}.get(self.mode, self.mode)


def compile_options(compile) -> dict | None:
    """`generate`'s `compile` -> the `compiled_denoise_pass` options, or None (no compilation)."""
    if compile is None or compile is False:
        return None
    if not isinstance(compile, (bool, dict)):
        raise TypeError(f"`compile` must be a bool or a dict of options {list(COMPILE_OPTIONS)}, got {compile!r}")
    options = compile if isinstance(compile, dict) else {}
    unknown = sorted(set(options) - set(COMPILE_OPTIONS))
    if unknown:
        raise ValueError(f"`compile` options {unknown} are not supported; supported: {list(COMPILE_OPTIONS)} "
                         "(the pass always compiles with fullgraph=True, dynamic=False)")
    return dict(options)


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")


def run_options(batching, max_batch_size, compile, batch_invariant, return_trace, trace_top_k, trace_sc_embedding,
                per_row: bool, batch: int, streamer, past_key_values) -> RunOptions:
    """Check the run options and resolve the mode (the choices are the module docstring's), refusing from
    `CAPABILITIES` whatever the mode cannot do."""
    if batching is not None and batching not in BATCHING:
        raise ValueError(f"`batching` must be one of {list(BATCHING)}, got {batching!r}")
    if max_batch_size is not None:
        check_positive_int("max_batch_size", max_batch_size)
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"`batch_invariant` must be a bool, got {batch_invariant!r}")
    if not isinstance(return_trace, bool):
        raise TypeError(f"`return_trace` must be a bool, got {return_trace!r}")
    if return_trace:
        check_positive_int("trace_top_k", trace_top_k)
    if trace_sc_embedding and not return_trace:
        raise ValueError("`trace_sc_embedding=True` needs `return_trace=True`")
    options = compile_options(compile)
    used = {"streamer": streamer is not None, "past_key_values": past_key_values is not None,
            "return_trace": return_trace, "compile": options is not None, "a global-RNG sampler": not per_row}
    features = [f for f, on in used.items() if on]
    if batch_invariant:
        if batching == "lockstep":
            raise ValueError("batch_invariant=True runs every row alone in the row pool (batching='mixed'); it "
                             "cannot be combined with batching='lockstep'")
        mode = "invariant"
    elif batching == "mixed":
        mode = "mixed"
    elif batching is None and per_row and batch > 1 and not any(
            used[f] for f in ("streamer", "past_key_values")):
        mode = "mixed"
    elif max_batch_size is not None and max_batch_size < batch:
        mode = "slices"
    else:
        mode = "lockstep"
    if not per_row and max_batch_size is not None and mode == "lockstep":
        mode = "slices"  # max_batch_size with a global-RNG sampler: refused below, by the table
    refuse(features, mode)
    return RunOptions(mode=mode, max_batch_size=max_batch_size, compile=options,
                      trace_top_k=trace_top_k if return_trace else None, trace_sc_embedding=bool(trace_sc_embedding))
