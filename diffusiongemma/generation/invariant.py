"""Batch-invariant mode of the row pool (`generate(batch_invariant=True)`, `diffusiongemma serve --batch-invariant`):
a row's arithmetic never depends on the rows that share its pass, so a seeded row's logits and tokens are
bit-identical to its solo run (the same call with that row alone), whatever its partners are.

Where the default pool lets a row's neighbours into its arithmetic, and how this mode closes each place:

1. The decoder forward (`passes.forward_rows` -> `stack.run_rows`). In the default pool every row of a pass shares one
   forward, so a row's numbers depend on its partners through:
   - the expert GEMMs (moe.py): the (token, slot) assignments of all rows are sorted by expert into one grouped GEMM;
     CPU `grouped_mm` rounds a row according to its position inside its expert's block, and that position depends
     on how many rows of the other sequences picked the same expert;
   - every dense GEMM (q/k/v/o projections, the dense MLP, self-conditioning, the router): the GEMM library picks
     its blocking (and on a GPU its split-K) from the row count n*T, so the same row can be reduced in another order;
   - attention over packed rows: the query length T is the longest row of the pass (a denoising row's L queries
     ride in a prefill-length pass), the key view spans [min S_b, max S_b + T) of all rows, and the masks are
     materialized for that span, so SDPA tiles and reduces a row's keys differently;
   - the self-conditioning MLP over the gathered denoising rows of the pass.
   Closed by running each row's forward alone: one `run_rows` call per row over its own batch-1 `RowCache`
   (`PerRowCaches`), so every tensor a row touches has the shape of its solo run (T = its own tokens, keys
   [0, S_b + T) of its own cache). No kernel is trusted to be invariant in the batch dimension.
2. The engine step after the decoder (`engine.denoise_rows`): the LM head (a [d*L, H] x [H, V] GEMM), the final
   softcap, the sampler's softmax/entropy reductions and the soft-embedding matmul ([d*L, V] x [V, H], the
   vocabulary matmul feeding self-conditioning) run over all denoising rows of a plan at once. Closed by giving every
   row its own group: one `denoise_rows` call per row, shapes [1, L, ...] as alone. The pass still makes one host
   read for all rows.
3. The random numbers: every row draws from its own generator in its solo order (already so in the default pool).
4. `generate`'s first self-conditioning input (`self_conditioning_logits`) is embedded per row in this mode.

What stays shared: nothing numeric. The pool only schedules (which rows run in a pass), and a row's cache slot, its
arrival time, its partners' phases, samplers, processors and prompt lengths never reach its arithmetic.

The cost: n small forwards instead of one per pass (see docs/generation.md, "Batch-invariant mode", for numbers).
The guarantee is per process and device: the same torch build, thread count and device (a GEMM library may still
choose kernels by thread count).

Legend: n rows in the pool, K kv heads, C capacity, D head dim.
"""

from ..modeling.cache import RowCache


class PerRowCaches:
    """One batch-1 `RowCache` per pool slot, with the pool-facing `reset` / `move` of a `RowCache`.

    Each row's keys live in a buffer of its own, so a row's attention reads a [1, K, S_b + T, D] view exactly as in
    its solo run (the pool's other rows never widen it).
    """

    def __init__(self, shapes, slots: int, capacity: int, device):
        self.slots = [RowCache(shapes, 1, capacity, device) for _ in range(slots)]
        self.capacity = capacity

    def row(self, slot: int) -> RowCache:
        return self.slots[slot]

    @property
    def lengths(self) -> list[int]:
        return [c.lengths[0] for c in self.slots]

    def reset(self, slot: int) -> None:
        self.slots[slot].reset(0)

    def move(self, src: int, dst: int) -> None:
        """Row `src`'s cache becomes row `dst`'s: the two buffers swap owners (no copy)."""
        self.slots[dst], self.slots[src] = self.slots[src], self.slots[dst]
