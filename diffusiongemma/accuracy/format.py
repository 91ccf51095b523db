"""The trace format (docs/trace-format.md): a `Trace` in memory, `DIR/manifest.json` + `DIR/trace.safetensors` on
disk, and the checks that name what is malformed.

A full trace has one record per (canvas, denoising step) of a lock-step batch; a minimal trace holds only the
prompts and the committed tokens (`sequences`).

Legend: R records (canvas, step), B batch, P prompt, L canvas length, k top-k width, C canvases.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

FORMAT_NAME = "diffusiongemma-trace"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "trace.safetensors"

# name -> (dtype, shape template); letters are checked against each other and the manifest
STEP_TENSORS = {
    "canvas_index": (torch.int32, "R"),
    "step_index": (torch.int32, "R"),
    "steps_remaining": (torch.int32, "R"),
    "temperature": (torch.float32, "R"),
    "active": (torch.bool, "RB"),
    "input_canvas": (torch.int32, "RBL"),
    "sc_present": (torch.bool, "RB"),
    "sc_ids": (torch.int32, "RBLk"),
    "sc_logprobs": (torch.float32, "RBLk"),
    "topk_ids": (torch.int32, "RBLk"),
    "topk_logprobs": (torch.float32, "RBLk"),
    "argmax": (torch.int32, "RBL"),
    "entropy": (torch.float32, "RBL"),
    "accepted": (torch.bool, "RBL"),
    "stopped": (torch.bool, "RB"),
}
OPTIONAL_STEP_TENSORS = {"sc_embedding": (torch.float32, "RBLH")}  # exact self-conditioning input
BASE_TENSORS = {"sequences": (torch.int32, "BT"), "attention_mask": (torch.bool, "BP")}
REQUIRED_MANIFEST = ("format", "version", "prompt_length", "canvas_length")


class TraceFormatError(ValueError):
    """A trace folder or object that does not follow docs/trace-format.md; the message names what is wrong."""


@dataclass
class Trace:
    """One generation's trace.

    Attributes:
        manifest: JSON-able dict (format, version, model, settings, versions, prompts; docs/trace-format.md).
        tensors: name -> CPU tensor; `sequences` [B, P + C*L] always, the per-step tensors of `STEP_TENSORS` in a
            full trace (stacked over R records in canvas, then step order).
    """

    manifest: dict
    tensors: dict

    @property
    def is_minimal(self) -> bool:
        """Only prompts and committed tokens: compare scores each committed canvas as a denoising fixed point."""
        return "input_canvas" not in self.tensors

    @property
    def prompt_length(self) -> int:
        return int(self.manifest["prompt_length"])

    @property
    def canvas_length(self) -> int:
        return int(self.manifest["canvas_length"])

    @property
    def num_canvases(self) -> int:
        return (self.tensors["sequences"].shape[1] - self.prompt_length) // self.canvas_length

    def committed(self, c: int) -> torch.Tensor:
        """[B, L] the tokens committed for canvas c (after EOS padding)."""
        start = self.prompt_length + c * self.canvas_length
        return self.tensors["sequences"][:, start : start + self.canvas_length]

    def steps(self, c: int) -> torch.Tensor:
        """Record indices [n] of canvas c, in step order."""
        return torch.nonzero(self.tensors["canvas_index"] == c).view(-1)

    def save(self, directory) -> Path:
        """Write `DIR/manifest.json` and `DIR/trace.safetensors` (the folder is created). Returns the folder."""
        from safetensors.torch import save_file

        validate(self)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST).write_text(json.dumps(self.manifest, indent=2, sort_keys=True, default=str) + "\n")
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(out / TENSORS))
        return out


def load_trace(directory) -> Trace:
    """Read a trace folder written by `Trace.save` (or by another engine following docs/trace-format.md).

    Raises:
        TraceFormatError: a missing file, unreadable JSON/safetensors, or a field of the wrong name, dtype or shape.
    """
    from safetensors.torch import load_file

    folder = Path(directory)
    for name in (MANIFEST, TENSORS):
        if not (folder / name).is_file():
            raise TraceFormatError(f"{folder / name} is missing: a trace folder holds {MANIFEST} and {TENSORS}")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{folder / MANIFEST} is not valid JSON: {e}") from None
    try:
        tensors = load_file(str(folder / TENSORS))
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise TraceFormatError(f"{folder / TENSORS} is not a readable safetensors file: {e}") from None
    trace = Trace(manifest, tensors)
    validate(trace)
    return trace


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise TraceFormatError(message)


def _check_tensor(name: str, tensor, dtype, template: str, sizes: dict) -> None:
    """dtype and rank of one tensor; letters of `template` bind to sizes and must agree across tensors."""
    _check(isinstance(tensor, torch.Tensor), f"tensor `{name}` is missing")
    _check(tensor.dtype == dtype, f"tensor `{name}` must be {dtype}, got {tensor.dtype}")
    _check(tensor.dim() == len(template), f"tensor `{name}` must have shape [{', '.join(template)}], got "
           f"{list(tensor.shape)}")
    for letter, size in zip(template, tensor.shape):
        if sizes.setdefault(letter, size) != size:
            raise TraceFormatError(f"tensor `{name}` has {letter} = {size}, but another tensor (or the manifest) has "
                                   f"{letter} = {sizes[letter]}; shape {list(tensor.shape)} (template "
                                   f"[{', '.join(template)}])")


def validate(trace: Trace) -> None:
    """Check a trace against docs/trace-format.md. Raises `TraceFormatError` naming the first problem."""
    m, t = trace.manifest, trace.tensors
    _check(isinstance(m, dict), "manifest.json must hold a JSON object")
    for key in REQUIRED_MANIFEST:
        _check(key in m, f"manifest.json lacks `{key}` (required: {', '.join(REQUIRED_MANIFEST)})")
    _check(m["format"] == FORMAT_NAME, f"manifest `format` must be {FORMAT_NAME!r}, got {m['format']!r}")
    _check(m["version"] == FORMAT_VERSION, f"manifest `version` {m['version']!r} is not supported (this reader "
           f"reads version {FORMAT_VERSION})")
    for key in ("prompt_length", "canvas_length"):
        _check(isinstance(m[key], int) and m[key] >= (1 if key == "canvas_length" else 0),
               f"manifest `{key}` must be a non-negative int (canvas_length positive), got {m[key]!r}")
    sizes = {"P": m["prompt_length"]}
    _check_tensor("sequences", t.get("sequences"), *BASE_TENSORS["sequences"], sizes)
    new = sizes["T"] - m["prompt_length"]
    _check(new >= 0 and new % m["canvas_length"] == 0,
           f"tensor `sequences` has {sizes['T']} tokens: prompt_length ({m['prompt_length']}) plus a whole number of "
           f"canvases of canvas_length ({m['canvas_length']}) expected")
    if "attention_mask" in t:
        _check_tensor("attention_mask", t["attention_mask"], *BASE_TENSORS["attention_mask"], sizes)
    present = [name for name in STEP_TENSORS if name in t]
    if not present:
        return  # a minimal trace
    missing = [name for name in STEP_TENSORS if name not in t]
    _check(not missing, f"a full trace needs every per-step tensor; missing: {', '.join(missing)} (a minimal trace "
           "holds only `sequences` and optionally `attention_mask`)")
    sizes["L"] = m["canvas_length"]
    for name, (dtype, template) in STEP_TENSORS.items():
        _check_tensor(name, t[name], dtype, template, sizes)
    for name, (dtype, template) in OPTIONAL_STEP_TENSORS.items():
        if name in t:
            _check_tensor(name, t[name], dtype, template, sizes)
    vocab = m.get("vocab_size")
    canvases = new // m["canvas_length"]
    ci = t["canvas_index"]
    _check(bool(((ci >= 0) & (ci < canvases)).all()), f"tensor `canvas_index` must lie in [0, {canvases}) (the "
           "canvases in `sequences`)")
    _check(bool((ci[1:] >= ci[:-1]).all()), "tensor `canvas_index` must be non-decreasing (records in canvas order)")
    for name in ("input_canvas", "argmax", "topk_ids", "sc_ids"):
        if vocab is not None:
            _check(bool(((t[name] >= 0) & (t[name] < vocab)).all()), f"tensor `{name}` holds token ids outside "
                   f"[0, vocab_size={vocab})")
    _check(bool(torch.isfinite(t["temperature"]).all() & (t["temperature"] > 0).all()),
           "tensor `temperature` must be finite and positive")
