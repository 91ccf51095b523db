"""Streamers: transformers' TextDiffusionStreamer, our CanvasPrinter, and the put/put_draft/end contract."""

import io

import pytest

import torch
from transformers.generation.streamers import TextDiffusionStreamer

from conftest import tiny_model, tiny_tokenizer
from diffusiongemma.generation.streamers import CanvasPrinter


class Recorder:
    def __init__(self):
        self.events = []

    def put(self, value):
        self.events.append(("put", value.clone()))

    def put_draft(self, value=None, logits=None):
        self.events.append(("draft", value.clone()))

    def end(self):
        self.events.append(("end", None))


def test_contract_order_and_shapes():
    model = tiny_model()
    rec = Recorder()
    ids = torch.randint(3, 128, (1, 5))
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=32, max_denoising_steps=3, streamer=rec)
    kinds = [k for k, _ in rec.events]
    assert kinds[0] == "put" and torch.equal(rec.events[0][1], ids)
    assert kinds[-1] == "end"
    puts = [v for k, v in rec.events if k == "put"][1:]
    assert torch.equal(torch.cat([ids] + puts, dim=1), out.sequences)  # committed canvases, in order
    drafts = [v for k, v in rec.events if k == "draft"]
    assert 2 <= len(drafts) <= 6 and all(d.shape == (1, 16) for d in drafts)
    # the last draft of each canvas is what gets committed
    assert torch.equal(drafts[-1], puts[-1])


def test_builtin_text_diffusion_streamer_works(capsys):
    model = tiny_model()
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    out = model.generate(torch.tensor([tok("hi")["input_ids"]]), max_new_tokens=16, max_denoising_steps=2,
                         streamer=TextDiffusionStreamer(tok))
    printed = capsys.readouterr().out
    assert tok.decode(out.sequences[0, 2:]) in printed.replace("\x1b8\x1b[J", "")


def test_canvas_printer_redraws_drafts_and_prints_text():
    model = tiny_model()
    tok = tiny_tokenizer()
    buf = io.StringIO()
    printer = CanvasPrinter(tok, show_drafts=True, total_canvases=1, stream=buf, ansi=True)  # as on a terminal
    torch.manual_seed(0)
    out = model.generate(torch.tensor([tok("hi")["input_ids"]]), max_new_tokens=16, max_denoising_steps=3,
                         streamer=printer)
    text = buf.getvalue()
    assert "\x1b7" in text and "\x1b8\x1b[J" in text  # saved cursor, restored and cleared per draft
    assert "[canvas 1/1, step 1]" in text
    assert text.rstrip("\n").endswith(tok.decode(out.sequences[0, 2:]))


class LogitsRecorder(Recorder):
    _takes_logits = True

    def put_draft(self, value=None, logits=None):
        self.events.append(("draft", logits.clone()))


def test_streamer_that_takes_logits_gets_every_steps_tempered_logits():
    model = tiny_model()
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=16, max_denoising_steps=3)
    rec = LogitsRecorder()
    model.generate(ids, streamer=rec, **kw)
    drafts = [v for kind, v in rec.events if kind == "draft"]
    assert drafts and all(d.shape == (2, 16, 128) and d.dtype == torch.float32 for d in drafts)
    # fast mode skips the LM head for rows that stopped: with several rows their logits would not exist
    with pytest.raises(ValueError, match="_takes_logits=True"):
        model.generate(ids, streamer=LogitsRecorder(), sampling="fast", **kw)
    rec = LogitsRecorder()
    model.generate(ids[:1], streamer=rec, sampling="fast", seed=0, **kw)
    assert all(v.shape == (1, 16, 128) for kind, v in rec.events if kind == "draft")
