"""`DiffusionGemmaDataCollator`: dataset rows -> training batches for `model(**batch)` and transformers' `Trainer`.

Rows come in three shapes:

    {"prompt": str, "completion": str}           prompt-completion
    {"messages": [{"role", "content"}, ...]}      chat: the last message (role "assistant" or "model") is the response,
                                                  everything before it, rendered by the tokenizer's chat template with
                                                  the generation prompt, is the prompt
    {"input_ids": [int], "labels": [int]}         already tokenized (`DiffusionGemmaDataCollator.tokenize`): prompt ids
                                                  and response ids (EOS included)

A batch is `input_ids` [B, P] (prompts left-padded with pad, as `generate` pads them), `attention_mask` [B, P] and
`labels` [B, K*L]: each response ends with EOS, its last canvas is filled with pad after the EOS, as generation
commits it (spec D.4 step 6), and these pad positions are scored; rows with fewer canvases than the longest are
padded with -100 (not scored). Prompt tokens never get the diffusion loss (they only enter the AR loss, weighted by
`model.config.ar_loss_weight`, default 1; 0 switches it off).

Legend: B batch, P longest prompt, K most canvases in the batch, L canvas length.
"""

import math
from collections.abc import Mapping

import torch

from .loss import IGNORE_INDEX

RESPONSE_ROLES = ("assistant", "model")


MARK = "\ue000{}\ue001"  # private-use characters: stand in for a message's text while the template renders


def special_token_texts(tokenizer) -> list[str]:
    """The text of every special token of `tokenizer` (EOS, BOS, pad, added control tokens such as turn markers)."""
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token))
    return sorted((t for t in texts if t), key=len, reverse=True)


def resolve_canvas_length(model, canvas_length) -> int:
    """The canvas length from `model`'s config or `canvas_length` (both: they must agree).

    Raises:
        TypeError: neither given. ValueError: not a positive int, or the two disagree.
    """
    if model is None and canvas_length is None:
        raise TypeError("DiffusionGemmaDataCollator needs the canvas length: pass model= (the model you train; its "
                        "config.canvas_length is used) or canvas_length= (an int, 256 for the released model)")
    if isinstance(model, int) and not isinstance(model, bool):
        raise TypeError(f"DiffusionGemmaDataCollator(tokenizer, {model}): the second argument is the model; pass "
                        f"canvas_length={model} by keyword")
    from_model = None
    if model is not None:
        config = getattr(model, "config", None)
        from_model = getattr(config, "canvas_length", None)
        if from_model is None:
            raise TypeError(f"model= must be a DiffusionGemma model (its config has canvas_length); got "
                            f"{type(model).__name__}")
    value = from_model if canvas_length is None else canvas_length
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"canvas_length must be a positive int, got {value!r}")
    if from_model is not None and canvas_length is not None and canvas_length != from_model:
        raise ValueError(f"canvas_length={canvas_length} disagrees with the model's config.canvas_length="
                         f"{from_model}; drop canvas_length= (the model's is used)")
    return value


class RowError(ValueError):
    """A dataset row the collator cannot use; the message names the row (when known) and the field."""


class DiffusionGemmaDataCollator:
    """Turns prompt-completion, chat or tokenized rows into block-diffusion training batches.

    Args:
        tokenizer: a transformers tokenizer with `eos_token_id` (and, for chat rows, a chat template); its pad id
            (EOS when it has none) fills prompt padding and the tail of the last canvas.
        model: the model the batches are for; the canvas length is read from its config (`config.canvas_length`).
        canvas_length: L, the model's canvas length (256 for the released model), when no `model` is given. One of
            the two is required (both must agree): a batch laid out for another L would still be whole canvases of
            the model's L, trained in the wrong places. Each batch carries it (`labels_canvas_length`), and the
            model's `forward` refuses a batch laid out for another canvas length.
        max_length: refuse rows whose prompt + response (EOS included) are longer (None: no limit). Rows are never
            truncated.
        add_special_tokens: tokenize prompt-completion prompts with the tokenizer's special tokens (BOS); the
            completion never gets them.

    Text is data, never control: special-token text inside a prompt, completion or chat message (`"<eos>"` typed by
    a user) is tokenized as the characters it is (`split_special_tokens`), not as the special token.

    Call:
        collator(rows) -> {"input_ids" [B, P], "attention_mask" [B, P], "labels" [B, K*L]} (torch.long) and
        "labels_canvas_length" (L, a 0-d long tensor)
    """

    def __init__(self, tokenizer, model=None, canvas_length: int | None = None, max_length: int | None = None,
                 add_special_tokens: bool = True):
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token_id: a response must end with EOS, as generation stops")
        canvas_length = resolve_canvas_length(model, canvas_length)
        if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise ValueError(f"max_length must be an int >= 2 or None, got {max_length!r}")
        self.tokenizer = tokenizer
        self.canvas_length = canvas_length
        self.max_length = max_length
        self.add_special_tokens = add_special_tokens
        self.eos_token_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
        self.special_texts = special_token_texts(tokenizer)

    def tokenize(self, row: Mapping, where: str = "a row") -> dict:
        """One row -> {"input_ids": prompt ids, "labels": response ids ending with EOS} (lists of ints).

        Use it with `dataset.map(collator.tokenize)` to tokenize once, before training (rows that are already
        tokenized pass through, checked). `where` names the row in errors (e.g. "line 12 of data.jsonl").
        """
        if not isinstance(row, Mapping):
            raise RowError(f"{where}: expected a JSON object (a dict), got {type(row).__name__}")
        if "input_ids" in row and "labels" in row:
            prompt, response = self._ids(row["input_ids"], "input_ids", where), self._ids(row["labels"], "labels", where)
        elif "messages" in row:
            prompt, response = self._chat(row["messages"], where)
        elif "prompt" in row and "completion" in row:
            prompt, response = self._prompt_completion(row["prompt"], row["completion"], where)
        else:
            hint = ""
            if not row or set(row) <= {"input_ids", "attention_mask"}:
                hint = (" (if it comes from transformers' Trainer, its remove_unused_columns dropped the text columns: "
                        "pass TrainingArguments(remove_unused_columns=False), or map the dataset through "
                        "collator.tokenize first)")
            raise RowError(f"{where}: needs 'prompt' and 'completion', or 'messages', or 'input_ids' and 'labels'; "
                           f"got keys {sorted(row)}{hint}")
        if not prompt:
            raise RowError(f"{where}: the prompt is empty (the encoder needs at least one token; a tokenizer with a BOS "
                           "token adds one)")
        if not response:
            raise RowError(f"{where}: the response is empty")
        if self.max_length is not None and len(prompt) + len(response) > self.max_length:
            raise RowError(f"{where}: {len(prompt)} prompt + {len(response)} response tokens (EOS included) exceed "
                           f"max_length {self.max_length}; rows are not truncated: shorten it, drop it or raise "
                           "max_length")
        return {"input_ids": prompt, "labels": response}

    def _ids(self, ids, field: str, where: str) -> list[int]:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        vocab = len(self.tokenizer)
        if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise RowError(f"{where}: '{field}' must be a list of token ids (ints)")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise RowError(f"{where}: '{field}' holds ids outside the tokenizer's vocabulary [0, {vocab}): {bad[:5]}")
        return list(ids)

    def _with_eos(self, response: list[int]) -> list[int]:
        return response if response and response[-1] == self.eos_token_id else response + [self.eos_token_id]

    def _prompt_completion(self, prompt, completion, where: str) -> tuple[list[int], list[int]]:
        for name, value in (("prompt", prompt), ("completion", completion)):
            if not isinstance(value, str):
                raise RowError(f"{where}: '{name}' must be a string, got {type(value).__name__} (chat rows use "
                               "'messages')")
        if not completion:
            raise RowError(f"{where}: 'completion' is empty")
        ids = self.tokenizer(prompt, add_special_tokens=self.add_special_tokens, split_special_tokens=True)["input_ids"]
        response = self.tokenizer(completion, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return list(ids), self._with_eos(list(response))

    def _chat(self, messages, where: str) -> tuple[list[int], list[int]]:
        if not isinstance(messages, list) or not messages:
            raise RowError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
                raise RowError(f"{where}: messages[{i}] must be an object with 'role' and 'content'")
        if messages[-1]["role"] not in RESPONSE_ROLES:
            raise RowError(f"{where}: the last message is the response and must have role 'assistant' or 'model', got "
                           f"{messages[-1]['role']!r}")
        if len(messages) < 2:
            raise RowError(f"{where}: 'messages' needs at least one message before the response")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RowError(f"{where}: chat rows need a tokenizer with a chat template")
        prompt = self._render(messages[:-1], True, where)
        full = self._render(messages, False, where)
        if full[: len(prompt)] != prompt:
            raise RowError(f"{where}: the chat template renders the conversation so that it does not start with the "
                           "prompt rendered with add_generation_prompt=True (does the template's generation prompt "
                           f"match how it writes a {messages[-1]['role']!r} turn?); cannot split prompt from response")
        return prompt, self._with_eos(full[len(prompt):])

    def _render(self, messages, generation_prompt: bool, where: str) -> list[int]:
        """The template's token ids for `messages`; message text holding special-token text is tokenized as text
        (the template's own special tokens stay control tokens)."""
        literal = [i for i, m in enumerate(messages) if self._holds_special_text(m["content"])]
        if not literal:
            out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                                     return_dict=False)
            return list(out)
        for i in literal:
            if not isinstance(messages[i]["content"], str):
                raise RowError(f"{where}: messages[{i}] holds special-token text ({self._special_in(messages[i])}) "
                               "inside structured content; give it as a plain string")
        # render with a marker in place of each such message's text, then tokenize the template's text as the
        # template (its control tokens) and the message text with split_special_tokens
        marked = [dict(m, content=MARK.format(i)) if i in literal else m for i, m in enumerate(messages)]
        text = self.tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=generation_prompt)
        verbatim = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        pieces, rest = [], text
        for i in literal:
            before, found, rest = rest.partition(MARK.format(i))
            pieces += [(before, False), (messages[i]["content"], True)]
            if not found or MARK.format(i) in rest:
                break
        pieces.append((rest, False))
        if "".join(p for p, _ in pieces) != verbatim:
            raise RowError(f"{where}: messages[{i}] holds special-token text ({self._special_in(messages[i])}) "
                           "and the chat template does not copy that message's text verbatim, so it cannot be kept "
                           "as text; remove the special-token text")
        ids = []
        for piece, is_message in pieces:
            ids += self.tokenizer(piece, add_special_tokens=False, split_special_tokens=is_message)["input_ids"]
        return ids

    def _holds_special_text(self, content) -> bool:
        text = content if isinstance(content, str) else repr(content)
        return any(t in text for t in self.special_texts)

    def _special_in(self, message) -> str:
        text = message["content"] if isinstance(message["content"], str) else repr(message["content"])
        return ", ".join(repr(t) for t in self.special_texts if t in text)

    def canvases(self, response: list[int]) -> list[int]:
        """Response ids (EOS included) -> K*L labels: the last canvas filled with pad after them (scored)."""
        K = max(1, math.ceil(len(response) / self.canvas_length))
        return response + [self.pad_token_id] * (K * self.canvas_length - len(response))

    def __call__(self, rows: list) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("the collator got an empty batch")
        tokenized = [self.tokenize(row, f"batch row {i}") for i, row in enumerate(rows)]
        prompts = [t["input_ids"] for t in tokenized]
        labels = [self.canvases(t["labels"]) for t in tokenized]
        B, P, R = len(rows), max(map(len, prompts)), max(map(len, labels))
        input_ids = torch.full((B, P), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(B, P, dtype=torch.long)
        out_labels = torch.full((B, R), IGNORE_INDEX, dtype=torch.long)
        for b, (prompt, lab) in enumerate(zip(prompts, labels)):
            input_ids[b, P - len(prompt):] = torch.tensor(prompt)  # left padding, as generate pads prompts
            attention_mask[b, P - len(prompt):] = 1
            out_labels[b, : len(lab)] = torch.tensor(lab)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": out_labels,
                # a tensor, so that loops moving every value with .to(device) keep working
                "labels_canvas_length": torch.tensor(self.canvas_length)}
