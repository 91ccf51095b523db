"""`torch.multinomial(probs, 1)` for reference mode: the same samples and the same global-RNG consumption, with less
memory (one block of rows at a time) and, on CPU, about three times faster (exponential noise from `cpu_rng`).

`exact_multinomial` picks the fastest path that two probes, run once per process, prove exact on this build; the choice
is logged once (info), and a probe that fails or raises is logged as a warning. Every path is exact: a failed probe
only costs speed or memory.

Legend: N rows (positions), V vocab, R rows in a block.
"""

import math

import torch
from transformers.utils import logging

from . import cpu_rng
from .entropy_bound import first_argmax

logger = logging.get_logger(__name__)

NOISE_CHUNK = 1 << 16  # elements of exponential noise made per cpu_rng call (its scratch stays in L2)


def blocked_multinomial(probs: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """`torch.multinomial(probs, 1)` over [N, V] one block of rows at a time -> [N].

    Same samples and the same global-RNG consumption as one call on the whole tensor (checked by
    `multinomial_is_blockwise`), without its [N, V] noise buffer.
    """
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    for a in range(0, probs.shape[0], rows_per_block):
        out[a : a + rows_per_block] = torch.multinomial(probs[a : a + rows_per_block], 1).view(-1)
    return out


_BLOCKWISE_MULTINOMIAL: dict = {}


def _global_rng_state(device: torch.device) -> torch.Tensor:
    return torch.random.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)


def _set_global_rng_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cpu":
        torch.random.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state, device)


def multinomial_is_blockwise(device: torch.device) -> bool:
    """True if multinomial on row blocks reproduces one whole-tensor call on `device` (samples and RNG state).

    PyTorch draws one sample per row as argmax(p / Exp(1) noise) with the noise generated serially, which makes
    blocking exact; this probe guards against a version or device where that is not so (then we do not block).
    """
    key = str(device)
    if key not in _BLOCKWISE_MULTINOMIAL:
        g = torch.Generator(device=device).manual_seed(0)
        probs = torch.rand(6, 50, generator=g, device=device).softmax(-1)
        state = _global_rng_state(device)
        whole = torch.multinomial(probs, 1).view(-1)
        after_whole = _global_rng_state(device)
        _set_global_rng_state(state, device)
        blocked = blocked_multinomial(probs, 4)
        after_blocked = _global_rng_state(device)
        _set_global_rng_state(state, device)  # the probe leaves the global RNG untouched
        ok = torch.equal(whole, blocked) and torch.equal(after_whole, after_blocked)
        _BLOCKWISE_MULTINOMIAL[key] = ok
        if not ok:
            logger.warning(f"torch.multinomial on row blocks does not reproduce one whole-tensor call on {key}: "
                           "reference sampling draws over the whole [B*L, V] probabilities at once (exact, more "
                           "memory)")
    return _BLOCKWISE_MULTINOMIAL[key]


def _valid_probs(p: torch.Tensor) -> bool:
    """What `torch.multinomial` demands of p [R, V]: entries finite and >= 0, every row with a positive entry.

    CPU only (`fast_multinomial`'s input), so reading the answer never waits for a device.
    """
    row_max = p.amax(dim=-1)  # [R]
    return bool((p.amin() >= 0) & (row_max.amax() < math.inf) & (row_max.amin() > 0))


def fast_multinomial(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """`torch.multinomial(probs, 1).view(-1)` for contiguous fp32 CPU probs [N, V]: the same samples and the same
    generator state afterwards (checked by `fast_multinomial_is_exact`), about three times faster.

    Per block of rows: q = Exp(1) noise from `cpu_rng` (bit-identical to PyTorch's), sample = first argmax of p / q,
    as PyTorch computes it. A block PyTorch would reject goes to `torch.multinomial` itself, which raises its error.
    """
    N, V = probs.shape
    R = min(N, max(1, NOISE_CHUNK // V))  # rows per block
    cpu = dict(device="cpu")
    out = torch.empty(N, dtype=torch.long, **cpu)
    q = torch.empty(R * V, dtype=torch.float32, **cpu)  # [R*V] noise, then p / q
    chunk = min(R * V, NOISE_CHUNK)
    bits, work = torch.empty(chunk, dtype=torch.int64, **cpu), torch.empty(chunk, dtype=torch.float64, **cpu)
    for a in range(0, N, R):
        p = probs[a : a + R]  # [r, V]
        r = p.shape[0]
        if not _valid_probs(p):
            out[a : a + r] = torch.multinomial(p, 1, generator=generator).view(-1)
            continue
        noise = q[: r * V]
        for c in range(0, r * V, chunk):  # the noise stream in element order, as PyTorch draws it
            cpu_rng.exponential_(noise[c : c + chunk], generator, bits=bits, work=work)
        ratio = torch.div(p, noise.view(r, V), out=noise.view(r, V))  # [r, V], PyTorch's div_out(q, p, q)
        out[a : a + r] = first_argmax(ratio)
    return out


_FAST_MULTINOMIAL: list = []


def _fast_multinomial_probe() -> tuple[bool, str]:
    """(exact, why) for `fast_multinomial_is_exact`; leaves the global RNG as it found it."""
    g = torch.Generator().manual_seed(0)
    cases = [torch.rand(3000, 97, generator=g, dtype=torch.float32).pow_(4),
             torch.rand(5, 3 * NOISE_CHUNK // 2, generator=g, dtype=torch.float32)]
    cases[0][:, ::7] = 0.0  # zero-probability tokens
    cases[0][::5, 1::2] = 0.5  # ties
    state = torch.random.get_rng_state()
    try:
        if not cpu_rng.exponential_matches_torch():
            return False, "cpu_rng's exponential noise differs from this PyTorch build's"
        for probs in cases:
            probs = probs / probs.sum(-1, keepdim=True)  # [rows, V] fp32
            start = torch.random.get_rng_state()
            expected = torch.multinomial(probs, 1).view(-1)
            after = torch.random.get_rng_state()
            torch.random.set_rng_state(start)
            got = fast_multinomial(probs)
            if not torch.equal(got, expected):
                return False, f"its samples differ from torch.multinomial's (vocab {probs.shape[1]})"
            if not torch.equal(torch.random.get_rng_state(), after):
                return False, "it leaves the global RNG in another state than torch.multinomial"
        return True, "it reproduces torch.multinomial on this build"
    except Exception as error:  # anything unexpected on another build: PyTorch's own multinomial stays exact
        return False, f"the probe raised {type(error).__name__}: {error}"
    finally:
        torch.random.set_rng_state(state)  # the probe leaves the global RNG untouched


def fast_multinomial_is_exact() -> bool:
    """True if `fast_multinomial` reproduces `torch.multinomial` here (samples and global RNG state); probed once.

    Covers exact zeros and ties in p, a vocab with no power-of-two block (one-level argmax) and one with blocks,
    rows spanning several noise chunks, and the libm fix-up inside cpu_rng (`exponential_matches_torch`). The
    outcome is logged once: info when the fast path runs, a warning (with the reason) when PyTorch's runs instead.
    """
    if not _FAST_MULTINOMIAL:
        ok, why = _fast_multinomial_probe()
        _FAST_MULTINOMIAL.append(ok)
        if ok:
            logger.info(f"reference sampling on CPU draws with cpu_rng's exact multinomial: {why}")
        else:
            logger.warning(f"reference sampling on CPU uses torch.multinomial (exact, about 3x slower) because "
                           f"cpu_rng's fast multinomial failed its exactness probe: {why}")
    return _FAST_MULTINOMIAL[0]


def exact_multinomial(probs: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """`torch.multinomial(probs, 1).view(-1)` for probs [N, V], bit for bit and with the same global-RNG draws, by
    the fastest path proven exact here: cpu_rng's (CPU fp32), row blocks, or one whole-tensor call."""
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and fast_multinomial_is_exact():
        return fast_multinomial(probs)
    if multinomial_is_blockwise(probs.device):
        return blocked_multinomial(probs, rows_per_block)
    return torch.multinomial(probs, num_samples=1).view(-1)
