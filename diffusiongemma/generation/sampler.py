"""Sampler math (spec D.4c-g) as pure functions, and the two samplers built from them.

Reference mode draws random numbers with the same torch calls, shapes and order as transformers' built-in `generate`
(global RNG): per canvas one `randint(B, L)`; per step one `multinomial` over B*L rows, then one `randint(B, L)`.

Fast mode draws from the same distributions with far less work: one uniform per position against the CDF instead of
V exponentials, every quantity (argmax, entropy, sample, self-conditioning probabilities) from one exp pass over a
cache-sized block of rows, and one `torch.Generator` per row, so a row's draws never depend on the rest of the batch.

Both walk the [B*L, V] logits in blocks of rows (`row_block`): every per-row op gives the same bits on a block as on the
whole tensor, and `multinomial` (exponential noise drawn serially) consumes the global RNG identically, so blocking
keeps reference mode exact while temporaries stay a few MB instead of extra [B, L, V] buffers. On CPU that noise comes
from `cpu_rng`, which makes PyTorch's exact values from the same generator about three times faster.

Legend: B batch, L canvas length, V vocab, N = B*L flattened positions, R rows in a block, H hidden.
"""

import math
from typing import Callable, NamedTuple, Protocol

import torch

from . import cpu_rng


def temperature_at(steps_remaining: int, max_steps: int, t_min: float, t_max: float) -> torch.Tensor:
    """Linear schedule T = t_min + (t_max - t_min) * n / N, with n counting the steps *remaining* (spec D.4c).

    Computed like the reference: n is an int32 tensor, so the division happens in fp32. Returns a 0-d fp32 tensor.
    """
    n = torch.tensor(steps_remaining, dtype=torch.int32)
    return t_min + (t_max - t_min) * (n / max_steps)


def apply_temperature_(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """In place [B, L, V] / T: the reference's `scores / temperature`, without a new buffer."""
    return logits.div_(temperature.to(logits.device))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of Categorical(logits) per position, [..., V] -> [...], computed as torch.distributions does.

    Example: logits [0, 0] -> p = (1/2, 1/2) -> H = ln 2 = 0.6931; logits [0, -inf] -> H = 0 (the clamp turns
    0 * -inf into 0 * finfo.min = 0).
    """
    log_p = logits - logits.logsumexp(dim=-1, keepdim=True)
    p = log_p.softmax(dim=-1)
    return -(log_p.clamp_(min=torch.finfo(log_p.dtype).min).mul_(p)).sum(dim=-1)


def soft_group_rows(vocab_size: int, target_bytes: int = 64 << 20) -> int:
    """Rows of fp32 probabilities per self-conditioning matmul in fast mode (about `target_bytes`, at least 64)."""
    return max(64, target_bytes // (4 * vocab_size))


def row_block(vocab_size: int, target_bytes: int = 4 << 20) -> int:
    """Rows of fp32 logits per block so that one block is about `target_bytes` (stays in cache)."""
    return max(1, target_bytes // (4 * vocab_size))


def entropy_bound_accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Accept the lowest-entropy positions while the sum of the strictly lower-ranked entropies is <= bound.

    entropy [B, L] -> accepted [B, L] bool. The lowest-entropy position is always accepted; the accepted set is a
    prefix of the ascending ranking (spec D.4f). Example: entropies [0.3, 0.01, 0.05], bound 0.1 -> ranks
    (0.01, 0.05, 0.3), exclusive cumsums (0, 0.01, 0.06) all <= 0.1 -> all three accepted.
    """
    ranked, order = torch.sort(entropy, dim=-1)
    keep = torch.cumsum(ranked, dim=-1) - ranked <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def renoise(sample: torch.Tensor, accepted: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Accepted positions take the sample, all others fresh noise (the previous canvas is never kept, D.4g)."""
    return torch.where(accepted, sample, noise)


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


def multinomial_is_blockwise(device: torch.device) -> bool:
    """True if multinomial on row blocks reproduces one whole-tensor call on `device` (samples and RNG state).

    PyTorch draws one sample per row as argmax(p / Exp(1) noise) with the noise generated serially, which makes
    blocking exact; this probe guards against a version or device where that is not so (then we do not block).
    """
    key = str(device)
    if key not in _BLOCKWISE_MULTINOMIAL:
        g = torch.Generator(device=device).manual_seed(0)
        probs = torch.rand(6, 50, generator=g, device=device).softmax(-1)
        state = torch.random.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)
        whole = torch.multinomial(probs, 1).view(-1)
        after_whole = torch.random.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)
        set_state = torch.random.set_rng_state if device.type == "cpu" else (
            lambda s: torch.cuda.set_rng_state(s, device))
        set_state(state)
        blocked = blocked_multinomial(probs, 4)
        after_blocked = torch.random.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device)
        set_state(state)  # the probe leaves the global RNG untouched
        _BLOCKWISE_MULTINOMIAL[key] = torch.equal(whole, blocked) and torch.equal(after_whole, after_blocked)
    return _BLOCKWISE_MULTINOMIAL[key]


NOISE_CHUNK = 1 << 16  # elements of exponential noise made per cpu_rng call (its scratch stays in L2)


def _valid_probs(p: torch.Tensor) -> bool:
    """What `torch.multinomial` demands of p [R, V]: entries finite and >= 0, every row with a positive entry."""
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


def fast_multinomial_is_exact() -> bool:
    """True if `fast_multinomial` reproduces `torch.multinomial` here (samples and global RNG state); probed once.

    Covers exact zeros and ties in p, a vocab with no power-of-two block (one-level argmax) and one with blocks,
    rows spanning several noise chunks, and the libm fix-up inside cpu_rng (`exponential_matches_torch`).
    """
    if not _FAST_MULTINOMIAL:
        g = torch.Generator().manual_seed(0)
        cases = [torch.rand(3000, 97, generator=g, dtype=torch.float32).pow_(4),
                 torch.rand(5, 3 * NOISE_CHUNK // 2, generator=g, dtype=torch.float32)]
        cases[0][:, ::7] = 0.0  # zero-probability tokens
        cases[0][::5, 1::2] = 0.5  # ties
        state = torch.random.get_rng_state()
        try:
            ok = cpu_rng.exponential_matches_torch()
            for probs in cases:
                probs = probs / probs.sum(-1, keepdim=True)  # [rows, V] fp32
                start = torch.random.get_rng_state()
                expected = torch.multinomial(probs, 1).view(-1)
                after = torch.random.get_rng_state()
                torch.random.set_rng_state(start)
                got = fast_multinomial(probs)
                ok = ok and torch.equal(got, expected) and torch.equal(torch.random.get_rng_state(), after)
        except Exception:  # anything unexpected on another build: use PyTorch's own multinomial
            ok = False
        finally:
            torch.random.set_rng_state(state)  # the probe leaves the global RNG untouched
        _FAST_MULTINOMIAL.append(ok)
    return _FAST_MULTINOMIAL[0]


def blocked_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows_per_block: int) -> torch.Tensor:
    """Apply a per-row function to [N, V] one block of rows at a time and concatenate (bit-identical to fn(x))."""
    return torch.cat([fn(x[a : a + rows_per_block]) for a in range(0, x.shape[0], rows_per_block)])


def _block_size(vocab_size: int) -> int:
    """Tokens per block for two-level searches: a divisor of V near 1024 (V itself when V has none)."""
    b = math.gcd(vocab_size, 1024)
    return b if b >= 32 else vocab_size


def first_argmax(x: torch.Tensor, block_max: torch.Tensor | None = None) -> torch.Tensor:
    """`x.argmax(-1)` for [R, V] (the first maximum), in two levels: block maxima, then one block.

    Same index as torch.argmax (ties go to the first occurrence in both levels), several times faster on CPU, where
    argmax is not vectorized but amax is. block_max: `block_maxima(x)` when the caller already has it.
    """
    R, V = x.shape
    b = _block_size(V)
    blocks = x.view(R, V // b, b)
    if block_max is None:
        block_max = blocks.amax(dim=-1)  # [R, V/b]
    block = block_max.argmax(dim=-1)  # [R]
    inside = blocks[torch.arange(R, device=x.device), block].argmax(dim=-1)  # [R]
    return block * b + inside


def block_maxima(x: torch.Tensor) -> torch.Tensor:
    """Maxima of x [R, V] over `first_argmax`'s blocks -> [R, V/b]; their max is the row max."""
    R, V = x.shape
    return x.view(R, V // _block_size(V), -1).amax(dim=-1)


def inverse_cdf_sample(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row from Categorical(weights / weights.sum()) with one uniform each (inverse CDF).

    weights [R, V] >= 0 (unnormalized, e.g. exp(z - max)); uniforms [R] in [0, 1) -> tokens [R]. Two levels keep
    the CDF accurate: block sums (fp32 sums of ~1024 values, accumulated in fp64) pick the block, an fp64 cumsum
    inside it picks the token. Zero-weight tokens are never chosen (the search takes the first CDF entry strictly
    above the target).

    Example: weights [1, 0, 3] (p = 1/4, 0, 3/4), u = 0.5 -> target 2.0, CDF [1, 1, 4] -> token 2.
    """
    R, V = weights.shape
    b = _block_size(V)
    blocks = weights.view(R, V // b, b)
    cdf = blocks.sum(dim=-1).to(torch.float64).cumsum(dim=-1)  # [R, V/b]
    target = uniforms.to(torch.float64) * cdf[:, -1]  # [R]
    block = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=V // b - 1)  # [R, 1]
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner = blocks[torch.arange(R, device=weights.device), block.view(-1)].to(torch.float64).cumsum(dim=-1)  # [R, b]
    token = torch.searchsorted(inner, target[:, None] - before, right=True).clamp_(max=b - 1)
    return (block * b + token).view(-1)


class OnePass(NamedTuple):
    """Everything a denoising step needs from the tempered logits of R rows."""

    sample: torch.Tensor  # [R] long
    argmax: torch.Tensor  # [R] long
    entropy: torch.Tensor  # [R] fp32
    probs: torch.Tensor  # [R, V] fp32 softmax (self-conditioning input)


def one_pass(logits: torch.Tensor, uniforms: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> OnePass:
    """Sample, argmax, entropy and softmax of logits [R, V] from one exp pass.

    With z = x - max, e = exp(z), s = sum(e): p = e / s, log p = z - log s, so
    H = -sum(p log p) = log s - sum(e z) / s. Example: x = [0, 0] -> z = [0, 0], s = 2, sum(e z) = 0, H = ln 2.

    scratch: optional two fp32 [>= R, V] buffers for z and e, reused block after block: a fresh multi-MB tensor per
    block costs more (page faults) than the exp itself. The returned probs then live in the second one.
    """
    R = logits.shape[0]
    z_out, e_out = (scratch[0][:R], scratch[1][:R]) if scratch is not None else (None, None)
    block_max = block_maxima(logits)  # [R, V/b], one pass serves the argmax and the row max
    argmax = first_argmax(logits, block_max)
    z = torch.sub(logits, block_max.amax(dim=-1, keepdim=True), out=z_out)  # [R, V]
    e = torch.exp(z, out=e_out)
    s = e.sum(dim=-1)  # [R]
    # -inf logits (masked by a processor) must contribute 0 * finite, not 0 * -inf
    ez = z.clamp_(min=torch.finfo(z.dtype).min).mul_(e).sum(dim=-1)  # [R] sum(e * z), z's buffer reused
    entropy = s.log() - ez / s
    sample = inverse_cdf_sample(e, uniforms)
    return OnePass(sample, argmax, entropy, e.div_(s[:, None]))


class StepOutput(NamedTuple):
    """What one sampler step returns (all rows it was given).

    `soft` is None when the caller passed no `soft_embed`: it then computes self-conditioning itself.
    """

    canvas: torch.Tensor  # [B, L] accepted samples + fresh noise
    argmax: torch.Tensor  # [B, L]
    entropy: torch.Tensor  # [B, L] (acceptance and stopping)
    soft: torch.Tensor | None  # [B, L, H]


SoftEmbed = Callable[[torch.Tensor], torch.Tensor]  # probs [..., V] fp32 -> soft embedding [..., H]


class Sampler(Protocol):
    def init_canvas(self, batch: int, length: int, device: torch.device, rows: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """A fresh noise canvas [B, L] (rows: which generators, fast mode)."""

    def step(self, logits: torch.Tensor, rows: torch.Tensor | None, soft_embed: SoftEmbed | None) -> StepOutput:
        """logits [B, L, V] tempered (may be overwritten) -> `StepOutput`. `rows` [B] names the batch rows the logits
        belong to (fast mode draws from their generators); reference mode always gets every row."""


class ReferenceSampler:
    """Entropy-bound sampler drawing from the global RNG exactly like the built-in implementation.

    Args:
        entropy_bound: acceptance budget (spec D.4f).
        vocab_size: V, the range of noise tokens.
    """

    def __init__(self, entropy_bound: float, vocab_size: int):
        self.entropy_bound = entropy_bound
        self.vocab_size = vocab_size

    def init_canvas(self, batch: int, length: int, device: torch.device, rows=None) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (batch, length), device=device)  # RNG: canvas init (D.4.3)

    def step(self, logits: torch.Tensor, rows=None, soft_embed: SoftEmbed | None = None) -> StepOutput:
        B, L, V = logits.shape
        flat = logits.view(B * L, V)
        block = row_block(V)
        argmax = blocked_rows(first_argmax, flat, block).view(B, L)  # [B, L], same indices as logits.argmax(-1)
        entropy = blocked_rows(token_entropy, flat, block).view(B, L)
        probs = torch.softmax(flat, dim=-1, out=flat)  # [N, V] in place (same bits): the logits are not needed again
        if logits.device.type == "cpu" and probs.dtype == torch.float32 and fast_multinomial_is_exact():
            sample = fast_multinomial(probs).view(B, L)  # RNG draw 1 (D.4d), cpu_rng's noise
        elif multinomial_is_blockwise(logits.device):
            sample = blocked_multinomial(probs, block).view(B, L)  # RNG draw 1 (D.4d), blockwise
        else:
            sample = torch.multinomial(probs, num_samples=1).view(B, L)  # RNG draw 1 (D.4d)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        noise = torch.randint(0, V, (B, L), device=logits.device)  # RNG draw 2, every position (D.4g)
        # with fp32 embeddings the built-in's self-conditioning softmax equals these probs bit for bit
        soft = soft_embed(probs.view(B, L, V)) if soft_embed is not None else None
        return StepOutput(renoise(sample, accepted, noise), argmax, entropy, soft)


def row_generators(batch: int, device: torch.device, seed=None, generator=None) -> list[torch.Generator]:
    """One generator per row for fast mode.

    Args:
        seed: int (row b gets seed + b) or a list of B ints.
        generator: a `torch.Generator` (B seeds are drawn from it) or a list of B generators (used as they are).
        Neither: B seeds are drawn from the global RNG, so `torch.manual_seed` still fixes the output.
    """
    if seed is not None and generator is not None:
        raise ValueError("Pass `seed` or `generator`, not both")
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"`generator` must be one torch.Generator or a list of {batch} (one per row)")
        return list(generator)
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch:
            raise ValueError(f"`seed` must be an int or a list of {batch} ints (one per row), got {len(seed)}")
        seeds = [int(s) for s in seed]
    elif seed is not None:
        seeds = [int(seed) + b for b in range(batch)]
    elif generator is not None:
        seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=generator.device).tolist()
    else:
        seeds = torch.randint(0, 2**62, (batch,)).tolist()
    return [torch.Generator(device=device).manual_seed(s) for s in seeds]


class FastSampler:
    """Entropy-bound sampler drawing from per-row generators with one uniform per position (same distribution as
    the reference, different random numbers).

    Args:
        entropy_bound: acceptance budget (spec D.4f).
        vocab_size: V.
        generators: one `torch.Generator` per batch row (`row_generators`).
    """

    def __init__(self, entropy_bound: float, vocab_size: int, generators: list[torch.Generator]):
        self.entropy_bound = entropy_bound
        self.vocab_size = vocab_size
        self.generators = generators

    def _per_row(self, draw: Callable[[torch.Generator], torch.Tensor], rows: torch.Tensor | None) -> torch.Tensor:
        ids = range(len(self.generators)) if rows is None else rows.tolist()
        return torch.stack([draw(self.generators[r]) for r in ids])

    def init_canvas(self, batch: int, length: int, device: torch.device, rows=None) -> torch.Tensor:
        V = self.vocab_size
        return self._per_row(lambda g: torch.randint(0, V, (length,), generator=g, device=device), rows)

    def step(self, logits: torch.Tensor, rows=None, soft_embed: SoftEmbed | None = None) -> StepOutput:
        B, L, V = logits.shape
        device = logits.device
        # per row: L uniforms for the samples, then L noise tokens (fixed order within the row's own generator)
        uniforms = self._per_row(lambda g: torch.rand(L, generator=g, device=device, dtype=torch.float64), rows)
        noise = self._per_row(lambda g: torch.randint(0, V, (L,), generator=g, device=device), rows)
        flat, u = logits.view(B * L, V), uniforms.view(-1)
        sample = torch.empty(B * L, dtype=torch.long, device=device)
        argmax, entropy = torch.empty_like(sample), torch.empty(B * L, device=device)
        soft = None
        block = min(row_block(V), B * L)
        # the probabilities of `group` rows (several blocks) are staged for one soft-embedding matmul: a matmul over a
        # few rows against the whole [V, H] embedding is several times slower per row at large V
        # (at most half the rows, so the stage never grows into a second [B, L, V] buffer)
        group = max(block, min(soft_group_rows(V), B * L // 2) // block * block) if soft_embed is not None else block
        z_scratch, stage = logits.new_empty(block, V), logits.new_empty(group, V)  # reused block after block
        for a in range(0, B * L, block):
            g = a % group  # this block's rows in the stage
            out = one_pass(flat[a : a + block], u[a : a + block], (z_scratch, stage[g:]))  # probs land in the stage
            sample[a : a + block], argmax[a : a + block], entropy[a : a + block] = out.sample, out.argmax, out.entropy
            end = min(a + block, B * L)
            if soft_embed is not None and (end % group == 0 or end == B * L):  # the stage is full: embed it
                start = end - (g + end - a)
                piece = soft_embed(stage[: end - start])  # [G, H]
                if soft is None:
                    soft = piece.new_empty(B * L, piece.shape[-1])
                soft[start:end] = piece
        sample, argmax, entropy = sample.view(B, L), argmax.view(B, L), entropy.view(B, L)
        accepted = entropy_bound_accept(entropy, self.entropy_bound)
        return StepOutput(renoise(sample, accepted, noise), argmax, entropy, soft.view(B, L, -1) if soft is not None
                          else None)


SAMPLERS = {"reference": ReferenceSampler, "fast": FastSampler}


def make_sampler(name: str, entropy_bound: float, vocab_size: int, generators: list | None = None) -> Sampler:
    """Pick a sampler once, by name ("reference" or "fast"; fast needs one generator per row)."""
    if name not in SAMPLERS:
        raise ValueError(f"`sampling` must be one of {sorted(SAMPLERS)}, got {name!r}")
    if name == "fast":
        return FastSampler(entropy_bound, vocab_size, generators)
    return ReferenceSampler(entropy_bound, vocab_size)
