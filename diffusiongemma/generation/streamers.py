"""Streamers. transformers' `TextDiffusionStreamer` works unchanged (it is re-exported here); `CanvasPrinter` is the
terminal view of the command line: it redraws the whole draft canvas in place at every denoising step.

Contract (spec D.7): `put(ids)` gets the prompt, then every committed canvas [B, L]; `put_draft(value=[B, L])` gets the
argmax canvas after every denoising step (if the streamer has that method); `end()` once.
"""

import sys

from transformers import TextStreamer
from transformers.generation.streamers import TextDiffusionStreamer

__all__ = ["TextDiffusionStreamer", "CanvasPrinter"]


class CanvasPrinter(TextStreamer):
    """Prints committed text as it lands and redraws the current draft canvas in place (batch 1).

    Args:
        tokenizer: decodes tokens.
        show_drafts: redraw every denoising draft (dimmed) below the committed text.
        progress: also print "[canvas k/n, step s]" on the line below the draft (to `stream`, like the text).
        total_canvases: n for the progress line.
        stream: where text goes (default stdout).
    """

    def __init__(self, tokenizer, show_drafts: bool = True, progress: bool = True, total_canvases: int | None = None,
                 stream=None, skip_prompt: bool = True, **decode_kwargs):
        super().__init__(tokenizer, skip_prompt=skip_prompt, **decode_kwargs)
        self.show_drafts = show_drafts
        self.progress = progress
        self.total_canvases = total_canvases
        self.stream = stream or sys.stdout
        self.canvas_index = 0
        self.step = 0
        self._draft_shown = False
        self.committed = 0

    def _clear_draft(self) -> None:
        if self._draft_shown:
            self.stream.write("\x1b8\x1b[J")  # restore cursor saved before the draft, erase below
            self._draft_shown = False

    def put_draft(self, value=None, logits=None) -> None:
        if value is None:
            return
        if value.shape[0] > 1:
            raise ValueError("CanvasPrinter supports batch size 1 only")
        self.step += 1
        self._clear_draft()
        if self.show_drafts:
            text = self.tokenizer.decode(value[0].tolist(), **self.decode_kwargs)
            total = f"/{self.total_canvases}" if self.total_canvases else ""
            status = f"[canvas {self.canvas_index + 1}{total}, step {self.step}]" if self.progress else ""
            self.stream.write("\x1b7" + f"\x1b[2m{text}\x1b[0m\n\x1b[33m{status}\x1b[0m")
            self._draft_shown = True
        self.stream.flush()

    def put(self, value) -> None:
        if value.dim() > 1 and value.shape[0] > 1:
            raise ValueError("CanvasPrinter supports batch size 1 only")
        self._clear_draft()
        if not self.next_tokens_are_prompt:
            self.canvas_index += 1
            self.step = 0
        super().put(value)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.stream.write(text)
        if stream_end:
            self.stream.write("\n")
        self.stream.flush()

    def end(self) -> None:
        self._clear_draft()
        super().end()
