"""Streamers. transformers' `TextDiffusionStreamer` works unchanged (it is re-exported here); `CanvasPrinter` is the
terminal view of the command line: it redraws the whole draft canvas in place at every denoising step (plain lines,
no escape codes, when the output is not a terminal).

Contract (spec D.7): `put(ids)` gets the prompt, then every committed canvas [B, L]; `put_draft(value=[B, L])` gets the
argmax canvas after every denoising step (if the streamer has that method); `end()` once.
"""

import sys

from transformers import TextStreamer
from transformers.generation.streamers import TextDiffusionStreamer

__all__ = ["TextDiffusionStreamer", "CanvasPrinter", "is_terminal"]


def is_terminal(stream) -> bool:
    """Whether `stream` is an interactive terminal (where ANSI cursor and colour codes belong)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class CanvasPrinter(TextStreamer):
    """Prints committed text as it lands and shows the current draft canvas (batch 1).

    On a terminal the draft is redrawn in place below the committed text (dimmed, with a coloured status line). When
    `stream` is not a terminal (a file, a pipe) or `ansi=False`, nothing but text is written: `stream` receives only
    the committed text, and each draft becomes one plain line "[canvas k/n, step s] draft" on `draft_stream`.

    Args:
        tokenizer: decodes tokens.
        show_drafts: show every denoising draft.
        progress: also show "[canvas k/n, step s]" with each draft.
        total_canvases: n for the progress line.
        stream: where text goes (default stdout).
        ansi: use ANSI escape codes; default: whether `stream` is a terminal.
        draft_stream: where plain draft lines go (default stderr, keeping `stream` the generated text only).
    """

    def __init__(self, tokenizer, show_drafts: bool = True, progress: bool = True, total_canvases: int | None = None,
                 stream=None, skip_prompt: bool = True, ansi: bool | None = None, draft_stream=None,
                 **decode_kwargs):
        super().__init__(tokenizer, skip_prompt=skip_prompt, **decode_kwargs)
        self.show_drafts = show_drafts
        self.progress = progress
        self.total_canvases = total_canvases
        self.stream = stream or sys.stdout
        self.ansi = is_terminal(self.stream) if ansi is None else ansi
        self.draft_stream = draft_stream or sys.stderr
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
            if self.ansi:  # save the cursor, dimmed draft, yellow status; `_clear_draft` restores and erases
                self.stream.write("\x1b7" + f"\x1b[2m{text}\x1b[0m\n\x1b[33m{status}\x1b[0m")
                self._draft_shown = True
            else:
                self.draft_stream.write(f"{status} {text}\n" if status else f"{text}\n")
                self.draft_stream.flush()
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
