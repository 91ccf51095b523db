"""Reference-accuracy toolkit: traces of `generate`, teacher-forced comparison of another engine's trace, checks of a
running OpenAI-compatible server, golden outputs (docs/reference-accuracy.md, docs/trace-format.md).

    format.py   the `Trace` object, its files, and the checks that name what is malformed
    record.py   recording a trace while `generate` runs (`return_trace=True`)
    replay.py   teacher-forced replay of a trace through our model, per-step metrics
    selfcond.py each replayed step's self-conditioning input: the record's top-k plus our previous step's tail
    rows.py     mixed-batch traces replayed and checked row by row, each row as its own one-row trace
    engine_compare.py  `compare --engine-url`: a running server's answers scored under the reference
    stats.py    the stratified Welch t-test behind it
    report.py   thresholds, the per-canvas table and JSON
    golden.py   golden outputs for another engine's CI
    cli.py      the `trace`, `compare` and `golden` commands
"""

from ..generation.recording import install_trace_recorder
from .format import FORMAT_NAME, FORMAT_VERSION, Trace, TraceFormatError, load_trace
from .record import TraceRecorder

install_trace_recorder(TraceRecorder)  # `generate(return_trace=True)` records with it

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Trace", "TraceFormatError", "load_trace"]
