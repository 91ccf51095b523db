"""PyTorch's CPU exponential noise, bit for bit, several times faster than `Tensor.exponential_` (reference sampling).

On CPU, `torch.multinomial(p, 1)` is argmax(p / q) per row with q = empty_like(p).exponential_(1), and each element
of q is made serially from the generator's mt19937 stream (PyTorch's `exponential_distribution<double>`):

    u = random64()                   two 32-bit draws r1, r2 -> (r1 << 32) | r2
    x = (u & (2^53 - 1)) * 2^-53     uniform double in [0, 1), exact
    q = float32(-1.0 * log1p(-x))    libm's scalar log1p in double, rounded to fp32 (round to nearest even)

The scalar log1p makes that loop cost ~25 ns per element. Here:

1. `random_()` on an int64 buffer: per element `random64()` mod 2^63, i.e. the same two draws from the same generator
   (the generator itself advances, so its state afterwards is exactly the one `exponential_` leaves), and the same
   low 53 bits. Still serial, but ~4 ns per element.
2. mask, form 1 - x (exact) and take torch's vectorized double `log`, then round to fp32.
3. The vectorized log may differ from libm's by an ulp or two in double. Rounding to fp32 drops the low 29 bits of
   the double's mantissa, so both round the same way unless the double lies within a few ulps of an fp32 rounding
   midpoint (low 29 bits near 2^28). Those elements (~1 in 4 million with the default margin) are recomputed with
   libm's own log1p, so every value equals PyTorch's.

`exponential_matches_torch` checks all of this against the real kernel once per process; callers fall back to
PyTorch's own ops when it fails (another PyTorch build, an MKL random-number path, a different libm).

Legend: n elements of one call.
"""

import ctypes
import math

import torch

MANTISSA = (1 << 53) - 1  # bits of a random64() that make the uniform double
LOW29 = (1 << 29) - 1  # double mantissa bits dropped when rounding to fp32
HALF = 1 << 28  # those bits at an fp32 rounding midpoint
MIDPOINT_MARGIN = 64  # double ulps around a midpoint recomputed with libm (both log1p are within ~1 ulp)


def _libm_log1p():
    """libm's log1p (the one PyTorch's scalar kernel calls); Python's math.log1p where libm cannot be opened."""
    try:
        fn = ctypes.CDLL("libm.so.6").log1p
    except (OSError, AttributeError):
        return math.log1p
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
    return fn


_LOG1P = _libm_log1p()


def exponential_(out: torch.Tensor, generator: torch.Generator | None = None, *, bits: torch.Tensor | None = None,
                 work: torch.Tensor | None = None, margin: int = MIDPOINT_MARGIN) -> torch.Tensor:
    """Fill contiguous fp32 CPU `out` (any shape, n elements) with what `out.exponential_(1, generator=generator)`
    gives.

    Args:
        generator: a CPU `torch.Generator`; None draws from the global one. Advanced by exactly 2n 32-bit draws.
        bits, work: optional scratch, int64 and fp64 with >= n elements (reuse them across calls to skip allocation).
        margin: double ulps around an fp32 rounding midpoint that are recomputed with libm (a test knob; larger
            only costs time, negative disables the fix-up).
    """
    if out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError(f"`out` must be a contiguous fp32 CPU tensor, got {out.dtype} on {out.device}")
    n = out.numel()
    k = (bits if bits is not None else torch.empty(n, dtype=torch.int64, device="cpu")).view(-1)[:n]  # [n]
    k.random_(generator=generator)  # random64() mod 2^63 per element: the same draws as exponential_
    return noise_from_bits_(out, k.bitwise_and_(MANTISSA), work, margin)


def noise_from_bits_(out: torch.Tensor, k: torch.Tensor, work: torch.Tensor | None = None,
                     margin: int = MIDPOINT_MARGIN) -> torch.Tensor:
    """out [n] fp32 <- float32(-log1p(-k * 2^-53)) exactly as libm + PyTorch compute it, for int64 k [n] in [0, 2^53).

    Example: k = 2^52 -> x = 0.5 -> -log1p(-0.5) = ln 2 = 0.6931471805599453 -> fp32 0.69314718 (0x3F317218).
    """
    n = out.numel()
    flat = out.view(-1)
    r = (work if work is not None else torch.empty(n, dtype=torch.float64, device="cpu")).view(-1)[:n]  # [n]
    # 1 - x = 1 - k * 2^-53 is exact in double (a multiple of 2^-53 in (0, 1]), so log(1 - x) and log1p(-x) are the
    # same real number; torch's vectorized log is faster than its log1p
    r.copy_(k).mul_(-(2.0**-53)).add_(1.0).log_()  # [n] log(1 - x) <= 0
    flat.copy_(r).abs_()  # fp32(-log(1 - x)); abs turns log(1) = +-0 into +0, as -1.0 * log1p(-0.0) = +0.0
    # t = (low 29 bits - (2^28 - margin)) mod 2^29 is <= 2 margin exactly within margin of a midpoint; r's buffer
    # is free now, so t overwrites it
    t = r.view(torch.int64).add_(margin - HALF).bitwise_and_(LOW29)  # [n] in [0, 2^29)
    # t's bit patterns read as doubles are non-negative subnormals in the same order, and a float min is vectorized
    if margin >= 0 and int(t.view(torch.float64).amin().view(torch.int64)) <= 2 * margin:
        near = (t <= 2 * margin).nonzero().view(-1)  # a handful
        exact = [-1.0 * _LOG1P(-(v * 2.0**-53)) for v in k.view(-1)[near].tolist()]
        flat[near] = torch.tensor(exact, dtype=torch.float64).to(torch.float32)
    return out


_EXACT: list = []


def exponential_matches_torch() -> bool:
    """True once `exponential_` has reproduced PyTorch's `exponential_` here: values and generator state.

    Checks ~200k elements with the default margin and with a margin wide enough that one element in ~250 takes the
    libm path, from an explicit generator (the global one is the same kind of object and is left untouched).
    """
    if not _EXACT:
        ok = True
        g = torch.Generator().manual_seed(1234)
        for n, margin in ((150_001, MIDPOINT_MARGIN), (50_000, 1 << 20)):
            torch.randint(0, 7, (3,), generator=g)  # leave the generator mid-block, as real use does
            start = g.get_state()
            expected = torch.empty(n, dtype=torch.float32, device="cpu").exponential_(1, generator=g)
            after = g.get_state()
            g.set_state(start)
            got = exponential_(torch.empty(n, dtype=torch.float32, device="cpu"), g, margin=margin)
            same = torch.equal(got.view(torch.int32), expected.view(torch.int32))  # bit patterns: +0.0 != -0.0
            ok = ok and same and torch.equal(g.get_state(), after)
        _EXACT.append(ok)
    return _EXACT[0]
