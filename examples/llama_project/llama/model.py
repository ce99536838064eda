"""A small Llama-style decoder: RMSNorm before each sub-layer, multi-head causal attention, SwiGLU MLP.

The parameter names are the usual ones of Llama code (tok_embeddings, layers.N.attention.wq/wk/wv/wo,
layers.N.feed_forward.w1/w2/w3, norm, output), so a tensor-parallel plan written for such models
fits it. Positions come from a learned embedding (pos_embeddings) instead of rotary embeddings.
The forward is plain tensor code (sizes from x.shape, no branch on data), so torch.fx can trace it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """Scale by the root mean square of the features (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class Attention(nn.Module):
    """Causal self-attention with separate query, key, value and output projections."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        assert dim % n_heads == 0, f"dim ({dim}) must be a multiple of n_heads ({n_heads})"
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[0], x.shape[1]
        # -1 heads: with wq/wk/wv split column-wise over tp ranks, each rank holds n_heads / tp of them.
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden_dim: int, norm_eps: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim, norm_eps)
        self.feed_forward = FeedForward(dim, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab_size); T may be at most max_seq_len."""

    def __init__(
        self,
        vocab_size: int,
        dim: int = 32,
        n_layers: int = 2,
        n_heads: int = 4,
        hidden_dim: int = 64,
        max_seq_len: int = 64,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos_embeddings = nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, n_heads, hidden_dim, norm_eps) for _ in range(n_layers))
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)  # its own weight, not the embedding's

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.pos_embeddings.weight[: tokens.shape[1]]
        h = self.tok_embeddings(tokens) + positions
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))
