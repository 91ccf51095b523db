"""lm-eval's `until` stop strings for block diffusion: early at canvas granularity, exact after the fact.

A canvas is committed whole, so a stop string cannot end generation mid-canvas. `StopStringsInCanvas` is a stopping
criterion `generate` asks after every committed canvas: a row stops early when the text of its last canvas holds a
stop string (no further canvas is denoised). A stop string that straddles two canvases is not seen there; it costs
at most the canvases until the end and is cut all the same by `cut_at_stop_strings`, which runs over the whole
generated text and keeps what comes before the first stop string (the answer lm-eval scores).
"""

import torch
from transformers import StoppingCriteria


class StopStringsInCanvas(StoppingCriteria):
    """[B] bool: the last committed canvas of each row, decoded on its own, holds one of `stops`.

    Args:
        tokenizer: decodes the canvas (special tokens skipped, as the answer is decoded).
        stops: the stop strings; empty ones are dropped (an empty string would stop every row).
    """

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]

    def __call__(self, input_ids: torch.LongTensor, scores, new_token_length: int | None = None,
                 **kwargs) -> torch.BoolTensor:
        L = new_token_length or input_ids.shape[1]
        texts = self.tokenizer.batch_decode(input_ids[:, -L:], skip_special_tokens=True)
        return torch.tensor([any(s in text for s in self.stops) for text in texts], dtype=torch.bool,
                            device=input_ids.device)


def cut_at_stop_strings(text: str, stops: list[str]) -> str:
    """`text` up to (not including) the earliest occurrence of any non-empty stop string; all of it without one."""
    ends = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return text[: min(ends)] if ends else text
