"""The run options record and the one capability table (generation/options.py)."""

import pytest

from diffusiongemma.generation.options import CAPABILITIES, MODE_NAMES, run_options

BASE = dict(batching=None, max_batch_size=None, compile=False, batch_invariant=False, return_trace=False,
            trace_top_k=8, trace_sc_embedding=False, per_row=True, batch=3, streamer=None, past_key_values=None)
MODE_ARGS = {"lockstep": dict(batching="lockstep"), "slices": dict(batching="lockstep", max_batch_size=2),
             "mixed": dict(batching="mixed"), "invariant": dict(batch_invariant=True)}
FEATURE_ARGS = {"streamer": dict(streamer=object()), "past_key_values": dict(past_key_values=object()),
                "return_trace": dict(return_trace=True), "compile": dict(compile=True),
                "a global-RNG sampler": dict(per_row=False)}


def options(**kw):
    return run_options(**dict(BASE, **kw))


@pytest.mark.parametrize("mode", list(MODE_ARGS))
@pytest.mark.parametrize("feature", list(FEATURE_ARGS))
def test_every_mode_runs_or_refuses_every_feature_from_the_table(mode, feature):
    kw = dict(MODE_ARGS[mode], **FEATURE_ARGS[feature])
    if mode in CAPABILITIES[feature]:
        with pytest.raises(ValueError) as error:
            options(**kw)
        # one message style: the mode, the feature, the table's reason
        assert str(error.value).startswith(f"{MODE_NAMES[mode]} cannot run with {feature}: ")
        assert CAPABILITIES[feature][mode] in str(error.value)
    else:
        assert options(**kw).mode == mode


def test_a_refusal_names_every_feature_at_once():
    with pytest.raises(ValueError, match="past_key_values: .*; return_trace: "):
        options(batching="lockstep", max_batch_size=2, past_key_values=object(), return_trace=True)


@pytest.mark.parametrize("kw, mode", [
    (dict(), "mixed"),  # per-row sampler, several rows
    (dict(batch=1), "lockstep"),
    (dict(per_row=False), "lockstep"),
    (dict(streamer=object()), "lockstep"),  # the documented choices: these select lock-step when batching is unset
    (dict(past_key_values=object()), "lockstep"),
    (dict(return_trace=True), "mixed"),  # a trace records the run the call makes without it
    (dict(return_trace=True, per_row=False), "lockstep"),
    (dict(compile=True), "mixed"),  # compiled mixed passes: compile no longer selects lock-step
    (dict(compile=True, batch=1), "lockstep"),
    (dict(compile=True, per_row=False), "lockstep"),
    (dict(batch_invariant=True), "invariant"),
    (dict(batching="lockstep", max_batch_size=3), "lockstep"),  # a slice as big as the batch is the batch
])
def test_unset_batching_choices(kw, mode):
    assert options(**kw).mode == mode


def test_the_record_holds_the_checked_options():
    record = options(batching="lockstep", compile={"backend": "eager"}, return_trace=True, trace_top_k=3)
    assert (record.mode, record.batching, record.compile, record.trace_top_k) == ("lockstep", "lockstep",
                                                                                  {"backend": "eager"}, 3)
    assert options(batching="lockstep", max_batch_size=2).batching == "chunks"
    assert options(batch_invariant=True).batching == "mixed"


@pytest.mark.parametrize("kw, error, message", [
    (dict(batching="continuous"), ValueError, "`batching` must be one of"),
    (dict(max_batch_size=0), ValueError, "`max_batch_size` must be a positive int"),
    (dict(batch_invariant=1), TypeError, "`batch_invariant` must be a bool"),
    (dict(return_trace="yes"), TypeError, "`return_trace` must be a bool"),
    (dict(return_trace=True, trace_top_k=0), ValueError, "`trace_top_k` must be a positive int"),
    (dict(trace_sc_embedding=True), ValueError, "needs `return_trace=True`"),
    (dict(compile="yes"), TypeError, "`compile` must be a bool or a dict"),
    (dict(batch_invariant=True, batching="lockstep"), ValueError, "batching='lockstep'"),
])
def test_bad_options_name_the_argument(kw, error, message):
    with pytest.raises(error, match=message):
        options(**kw)
