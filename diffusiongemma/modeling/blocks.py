"""Small building blocks of the Gemma 4 text stack: RMSNorm, gated MLP, scaled embedding, self-conditioning.

Legend: B batch, T tokens, H hidden, I dense intermediate, V vocab.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .parallel import is_dtensor, soft_embedding_rows


class RMSNorm(nn.Module):
    """Gemma 4 RMSNorm: fp32 math, the stored weight multiplies directly (no `1 + w`, pitfall H.2).

    `with_scale=False` gives the weightless variant (v_norm, router norm, self-conditioning post-norm).
    """

    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GatedMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)); used for the dense MLP and for self-conditioning."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class ScaledEmbedding(nn.Embedding):
    """Token embedding times sqrt(H), the constant rounded to the weight dtype first (spec C.1, pitfall H.1)."""

    def __init__(self, vocab_size: int, hidden_size: int, padding_idx: int | None):
        super().__init__(vocab_size, hidden_size, padding_idx)
        # A plain float, not a buffer: non-persistent buffers are left uninitialized by meta-device loading.
        self.embed_scale = hidden_size**0.5

    def scale(self) -> torch.Tensor:
        # fp32 first (as a torch scalar would be), then the weight dtype: 53.0 in bf16 for H = 2816
        return torch.tensor(self.embed_scale, dtype=torch.float32).to(self.weight.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.scale()

    def soft(self, probs: torch.Tensor) -> torch.Tensor:
        """Soft embedding of a distribution over the vocabulary: probs [B, T, V] -> [B, T, H] (spec C.9)."""
        if is_dtensor(self.weight):  # sharded on the vocabulary by tensor parallelism (modeling/parallel.py)
            return soft_embedding_rows(probs.to(self.weight.dtype), self.weight) * self.scale()
        return (probs.to(self.weight.dtype) @ self.weight) * self.scale()


class SelfConditioning(nn.Module):
    """x0 = post_norm_noscale(embeddings + MLP(pre_norm(soft_embeddings))) (spec C.9)."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float):
        super().__init__()
        self.pre_norm = RMSNorm(hidden_size, eps)
        self.post_norm = RMSNorm(hidden_size, eps, with_scale=False)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, embeddings: torch.Tensor, soft_embeddings: torch.Tensor | None) -> torch.Tensor:
        """embeddings [B, L, H]; soft_embeddings [B, L, H] or None (first step: the MLP of zeros is exactly 0)."""
        if soft_embeddings is None:
            return self.post_norm(embeddings)
        s = self.pre_norm(soft_embeddings)
        return self.post_norm(embeddings + self.down_proj(gelu_tanh(self.gate_proj(s)) * self.up_proj(s)))
