"""The trace format (docs/trace-format.md): a `Trace` in memory, `DIR/manifest.json` + `DIR/trace.safetensors` on
disk, and the checks that name what is malformed.

A full trace has one record per (canvas, denoising step) of a lock-step batch, or, from mixed batching, one record
per (row, canvas, step) with the row in `row_index` (`Trace.row` splits it into one-row lock-step traces); a minimal
trace holds only the prompts and the committed tokens (`sequences`).

Legend: R records (canvas, step), B batch, P prompt, L canvas length, k top-k width, C canvases.
"""

import json
import math
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
OPTIONAL_STEP_TENSORS = {
    "sc_embedding": (torch.float32, "RBLH"),  # exact self-conditioning input
    "draw_ids": (torch.int32, "RBL"),  # each position's drawn token (samplers that draft every position)
    "draw_logprobs": (torch.float32, "RBL"),  # its log-probability under the step's tempered distribution
}
ROW_INDEX = "row_index"  # int32 [R], mixed batching: the row of `sequences` each record is (its tensors [R, 1, ...])
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
    def is_mixed(self) -> bool:
        """Recorded with mixed batching: every record is one row's step (`row_index`), [R, 1, ...] wide."""
        return ROW_INDEX in self.tensors

    def row(self, b: int) -> "Trace":
        """Row b of a mixed trace as the one-row lock-step trace it is: its prompt without padding, its own
        canvases (not the fill after it finished) and its records, in canvas and step order."""
        t = self.tensors
        picked = torch.nonzero(t[ROW_INDEX] == b).view(-1)
        P, L = self.prompt_length, self.canvas_length
        sequence = t["sequences"][b]
        mask = t.get("attention_mask")
        prompt = sequence[:P][mask[b]] if mask is not None else sequence[:P]
        canvases = int(t["canvas_index"][picked].max()) + 1 if picked.numel() else 0
        tensors = {name: t[name][picked] for name in (*STEP_TENSORS, *OPTIONAL_STEP_TENSORS) if name in t}
        tensors["sequences"] = torch.cat([prompt, sequence[P : P + canvases * L]])[None]
        seeds = self.manifest.get("row_seeds")
        manifest = dict(self.manifest, prompt_length=len(prompt), batch_size=1, batching="lockstep", row=b,
                        row_seeds=[seeds[b]] if isinstance(seeds, list) and b < len(seeds) else None)
        manifest.pop("tensors_sha256", None)
        return Trace(manifest, tensors)

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

    def save(self, directory, overwrite: bool = False) -> Path:
        """Write `DIR/manifest.json` and `DIR/trace.safetensors` (the folder is created). Returns the folder.

        The folder is written atomically (`io.atomic.atomic_folder`): an interrupted save leaves the old trace whole,
        never a new manifest beside old tensors. The manifest records the sha256 of the tensors file, which
        `load_trace` checks, so a manifest and tensors of different writes are refused.

        Raises:
            FileExistsError: `directory` holds a trace already and `overwrite` is False.
        """
        from safetensors.torch import save_file

        from ..io.atomic import atomic_folder

        validate(self)
        out = Path(directory)
        if not overwrite and ((out / MANIFEST).exists() or (out / TENSORS).exists()):
            raise FileExistsError(f"{out} holds a trace already: pass overwrite=True (--overwrite) to replace it")
        with atomic_folder(out, overwrite=True) as work:
            save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(work / TENSORS))
            manifest = dict(self.manifest, tensors_sha256=_sha256(work / TENSORS))
            (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
        return out


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    expected = manifest.get("tensors_sha256") if isinstance(manifest, dict) else None
    if expected is not None and expected != _sha256(folder / TENSORS):
        raise TraceFormatError(f"{folder / TENSORS} does not match its manifest (`tensors_sha256`): the two files come "
                               "from different writes, or the tensors file is damaged")
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
        _check(_is_int(m[key]) and m[key] >= (1 if key == "canvas_length" else 0),
               f"manifest `{key}` must be a non-negative int (canvas_length positive), got {m[key]!r}")
    _check_manifest_types(m)
    sizes = {"P": m["prompt_length"]}
    _check_tensor("sequences", t.get("sequences"), *BASE_TENSORS["sequences"], sizes)
    new = sizes["T"] - m["prompt_length"]
    _check(new >= 0 and new % m["canvas_length"] == 0,
           f"tensor `sequences` has {sizes['T']} tokens: prompt_length ({m['prompt_length']}) plus a whole number of "
           f"canvases of canvas_length ({m['canvas_length']}) expected")
    if "attention_mask" in t:
        _check_tensor("attention_mask", t["attention_mask"], *BASE_TENSORS["attention_mask"], sizes)
        _check_left_padding(t["attention_mask"])
    _check(bool((t["sequences"] >= 0).all()), "tensor `sequences` holds negative token ids")
    if m.get("vocab_size") is not None:
        _check(bool((t["sequences"] < m["vocab_size"]).all()), f"tensor `sequences` holds token ids outside "
               f"[0, vocab_size={m['vocab_size']})")
    present = [name for name in STEP_TENSORS if name in t]
    rows = t.get(ROW_INDEX)
    _check(rows is None or bool(present), f"tensor `{ROW_INDEX}` names the row of each step record: it needs a full "
           "trace (a minimal trace holds only `sequences` and optionally `attention_mask`)")
    if not present:
        return  # a minimal trace
    missing = [name for name in STEP_TENSORS if name not in t]
    _check(not missing, f"a full trace needs every per-step tensor; missing: {', '.join(missing)} (a minimal trace "
           "holds only `sequences` and optionally `attention_mask`)")
    sizes["L"] = m["canvas_length"]
    step_sizes = sizes
    if rows is not None:  # mixed batching: each record is one row's step, [R, 1, ...]
        step_sizes = {k: v for k, v in sizes.items() if k != "B"}
        _check_tensor(ROW_INDEX, rows, torch.int32, "R", step_sizes)
        step_sizes["B"] = 1
        _check(bool(((rows >= 0) & (rows < sizes["B"])).all()), f"tensor `{ROW_INDEX}` must lie in [0, "
               f"{sizes['B']}) (the rows of `sequences`)")
        _check(bool((rows[1:] >= rows[:-1]).all()), f"tensor `{ROW_INDEX}` must be non-decreasing (records by row, "
               "then canvas and step)")
    for name, (dtype, template) in STEP_TENSORS.items():
        _check_tensor(name, t[name], dtype, template, step_sizes)
    for name, (dtype, template) in OPTIONAL_STEP_TENSORS.items():
        if name in t:
            _check_tensor(name, t[name], dtype, template, step_sizes)
    sizes.update({k: v for k, v in step_sizes.items() if k != "B"})
    vocab = m.get("vocab_size")
    canvases = new // m["canvas_length"]
    ci = t["canvas_index"]
    _check(bool(((ci >= 0) & (ci < canvases)).all()), f"tensor `canvas_index` must lie in [0, {canvases}) (the "
           "canvases in `sequences`)")
    new_row = rows[1:] != rows[:-1] if rows is not None else torch.zeros(max(len(ci) - 1, 0), dtype=torch.bool)
    _check(bool(((ci[1:] >= ci[:-1]) | new_row).all()), "tensor `canvas_index` must be non-decreasing (records in "
           "canvas order; in a mixed trace, within each row)")
    _check(("draw_ids" in t) == ("draw_logprobs" in t), "tensors `draw_ids` and `draw_logprobs` go together: the "
           "trace holds only one of them")
    for name in ("input_canvas", "argmax", "topk_ids", "sc_ids", "draw_ids")[:5 if "draw_ids" in t else 4]:
        _check(bool((t[name] >= 0).all()), f"tensor `{name}` holds negative token ids")
        if vocab is not None:
            _check(bool((t[name] < vocab).all()), f"tensor `{name}` holds token ids outside [0, vocab_size={vocab})")
    _check(bool(torch.isfinite(t["temperature"]).all() & (t["temperature"] > 0).all()),
           "tensor `temperature` must be finite and positive")
    _check_step_order(t)
    _check_values(t)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_manifest_types(m: dict) -> None:
    """The optional manifest keys `compare` reads must have their documented types (a mistyped one is a malformed
    trace, not a crash inside the replay)."""
    if m.get("vocab_size") is not None:
        _check(_is_int(m["vocab_size"]) and m["vocab_size"] > 0,
               f"manifest `vocab_size` must be a positive int, got {m['vocab_size']!r}")
    if m.get("sampling") is not None:
        _check(isinstance(m["sampling"], str), f"manifest `sampling` must be a string, got {m['sampling']!r}")
    g = m.get("generation_config")
    if g is None:
        return
    _check(isinstance(g, dict), f"manifest `generation_config` must be a JSON object, got {g!r}")
    checks = {
        "max_denoising_steps": (lambda v: _is_int(v) and v > 0, "a positive int"),
        "stability_threshold": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
        "confidence_threshold": (lambda v: _is_number(v) and v > 0, "a finite number > 0"),
        "t_min": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
        "t_max": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    }
    for key, (ok, what) in checks.items():
        if g.get(key) is not None:
            _check(ok(g[key]), f"manifest `generation_config.{key}` must be {what}, got {g[key]!r}")
    stopper = g.get("stopper_config")
    _check(stopper is None or isinstance(stopper, dict) and isinstance(stopper.get("_cls_name"), str),
           f"manifest `generation_config.stopper_config` must be a JSON object with its `_cls_name`, got {stopper!r}")
    sampler = g.get("sampler_config")
    if sampler is not None:
        _check(isinstance(sampler, dict), f"manifest `generation_config.sampler_config` must be a JSON object, got "
               f"{sampler!r}")
        bound = sampler.get("entropy_bound")
        if bound is not None:
            _check(_is_number(bound) and bound > 0, f"manifest `generation_config.sampler_config.entropy_bound` "
                   f"must be a finite number > 0, got {bound!r}")


def _check_left_padding(mask: torch.Tensor) -> None:
    """Every row keeps at least one prompt token, and padding (False) only on the left."""
    rows = torch.nonzero(~mask.any(dim=1)).view(-1).tolist()
    _check(not rows, f"tensor `attention_mask` rows {rows} are all False: every row needs a prompt token")
    right = torch.nonzero((mask.int().diff(dim=1) < 0).any(dim=1)).view(-1).tolist()  # a True followed by a False
    _check(not right, f"tensor `attention_mask` rows {right} are not left-padded (a False follows a True)")


def _check_step_order(t: dict) -> None:
    """Within each canvas, step_index counts 0, 1, 2, ... and steps_remaining counts down by one from >= 1."""
    ci, si, n = t["canvas_index"].tolist(), t["step_index"].tolist(), t["steps_remaining"].tolist()
    rows = t[ROW_INDEX].tolist() if ROW_INDEX in t else [0] * len(ci)
    for r in range(len(ci)):
        first = r == 0 or ci[r] != ci[r - 1] or rows[r] != rows[r - 1]
        expected = 0 if first else si[r - 1] + 1
        _check(si[r] == expected, f"tensor `step_index` at record {r} is {si[r]}, expected {expected} (canvas "
               f"{ci[r]}: steps 0, 1, ... in order)")
        _check(n[r] >= 1, f"tensor `steps_remaining` at record {r} is {n[r]}: it counts the steps left, >= 1")
        _check(first or n[r] == n[r - 1] - 1, f"tensor `steps_remaining` at record {r} is {n[r]}, expected "
               f"{n[r - 1] - 1} (one less than the record before)")


def _check_values(t: dict) -> None:
    """Values of the rows that are compared (active rows, and self-conditioning where present): no NaN, log-probs
    <= 0, entropies finite and >= 0; and some row is active somewhere (else there is nothing to compare)."""
    active = t["active"]  # [R, B]
    _check(bool(active.any()), "tensor `active` is False everywhere: no row of any record can be compared")
    eps = 1e-4  # float rounding of a log-softmax
    compared = [("topk_logprobs", active), ("sc_logprobs", active & t["sc_present"])]
    for name, where in compared + ([("draw_logprobs", active)] if "draw_logprobs" in t else []):
        values = t[name][where]
        _check(not bool(values.isnan().any()), f"tensor `{name}` holds NaN")
        _check(bool((values <= eps).all()), f"tensor `{name}` holds positive log-probabilities (> {eps})")
    entropy = t["entropy"][active]
    _check(bool(entropy.isfinite().all()), "tensor `entropy` holds NaN or Inf in active rows")
    _check(bool((entropy >= -eps).all()), "tensor `entropy` holds negative values in active rows")
    if "sc_embedding" in t:
        _check(bool(t["sc_embedding"][active & t["sc_present"]].isfinite().all()),
               "tensor `sc_embedding` holds NaN or Inf where `sc_present`")
