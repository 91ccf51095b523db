"""The terminal side of `diffusiongemma chat`: one streamed reply with its drafts, through the official `openai` client.

A draft is the text of the canvas being denoised (the chunk's extra `draft` field); committed text arrives as ordinary
content deltas. On a terminal the draft is redrawn in place under the committed text (the cursor is saved before it,
restored and the rest erased before the next); elsewhere nothing but plain text is written: content to `out`, one
line "[canvas c, step s] draft" per draft to `log`.
"""


class DraftView:
    """Shows committed text and the current draft.

    Args:
        out: where the reply goes (a terminal or a file).
        log: where plain draft lines go when `ansi` is False.
        ansi: redraw drafts in place with escape codes (only on a terminal).
        drafts: show drafts at all.
    """

    def __init__(self, out, log, ansi: bool, drafts: bool = True):
        self.out, self.log, self.ansi, self.drafts = out, log, ansi, drafts
        self._shown = False

    def _clear(self) -> None:
        if self._shown:
            self.out.write("\x1b8\x1b[J")  # back to the saved cursor, erase below
            self._shown = False

    def draft(self, text: str, canvas: int, step: int) -> None:
        if not self.drafts:
            return
        status = f"[canvas {canvas + 1}, step {step}]"
        if self.ansi:
            self._clear()
            self.out.write(f"\x1b7\x1b[2m{text}\x1b[0m\n\x1b[33m{status}\x1b[0m")
            self._shown = True
            self.out.flush()
        else:
            self.log.write(f"{status} {text}\n")
            self.log.flush()

    def commit(self, text: str) -> None:
        self._clear()
        self.out.write(text)
        self.out.flush()

    def finish(self) -> None:
        self._clear()
        self.out.write("\n")
        self.out.flush()


def stream_reply(client, model: str, messages: list, view: DraftView, max_tokens: int = 256, seed: int | None = None,
                 steps: int | None = None) -> str:
    """Stream one chat reply into `view`; returns the committed text."""
    return stream_turn(client, model, messages, view, max_tokens, seed, steps)[0]


def stream_turn(client, model: str, messages: list, view: DraftView, max_tokens: int = 256, seed: int | None = None,
                steps: int | None = None, tools: list | None = None, tool_choice=None) -> tuple[str, list[dict]]:
    """Stream one chat reply into `view`; returns (the committed text, its tool calls as OpenAI message entries,
    assembled from the streamed deltas by index)."""
    extra = {"stream_drafts": view.drafts}
    if steps is not None:
        extra["max_denoising_steps"] = steps
    kwargs = {"tools": tools} if tools else {}
    if tools and tool_choice is not None:
        kwargs["tool_choice"] = tool_choice
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, seed=seed,
                                            stream=True, extra_body=extra, **kwargs)
    reply, calls = [], {}
    for chunk in stream:
        draft = (chunk.model_extra or {}).get("draft")
        if draft:
            view.draft(draft["text"], draft["canvas"], draft["step"])
        for choice in chunk.choices:
            if choice.delta.content:
                reply.append(choice.delta.content)
                view.commit(choice.delta.content)
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
    for call in calls.values():
        view.commit(f"\n[tool call] {call['function']['name']} {call['function']['arguments']}")
    view.finish()
    return "".join(reply), [calls[i] for i in sorted(calls)]
