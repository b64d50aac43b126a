"""``sequence_transformer``: a transformer over each card's recent transactions.

A row holds a card's last ``seq_len`` transactions as step-major feature blocks (``(batch, seq_len · k)``, the
``card_sequences`` dataset: step 0 the oldest, the last step the transaction to score). The model reads them as
``seq_len`` tokens of ``k`` features: a linear step embedding plus a learnt position embedding, ``n_layers``
pre-norm blocks (multi-head self-attention over the steps, then a GELU MLP), a final LayerNorm, and a head on the
last token (the current transaction, which attends to its history).

Sized by configuration, from tiny (CPU tests) to hundreds of millions of parameters::

    model: {name: sequence_transformer, options: {seq_len: 8, d_model: 1024, n_heads: 16, n_layers: 24}}

has 12·d²·n_layers ≈ 302 M parameters in its blocks. The blocks live in ``layers`` (a ``ModuleDict`` keyed
"0", "1", …): FSDP shards each block as a unit, and a pipeline stage keeps a range of them
(:meth:`SequenceTransformer.pipeline_stage`) under their original names, so a stage's state-dict keys are the
whole model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: ``h + attn(ln(h))``, then ``h + mlp(ln(h))``."""

    def __init__(self, d_model: int, n_heads: int, ffn_mult: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, ffn_mult * d_model)
        self.down = nn.Linear(ffn_mult * d_model, d_model)
        self.dropout = dropout

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.attn_norm(h)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        # (batch, heads, steps, head_dim); every step sees the whole history (no causal mask: the head reads
        # the last step only, and earlier steps are context, not predictions).
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           dropout_p=self.dropout if self.training else 0.0)
        h = h + F.dropout(self.proj(a.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)
        return h + F.dropout(self.down(F.gelu(self.up(self.mlp_norm(h)))), self.dropout, self.training)


class StepEmbedding(nn.Module):
    """``(batch, seq_len · k)`` features → ``(batch, seq_len, d_model)`` tokens."""

    def __init__(self, step_features: int, seq_len: int, d_model: int) -> None:
        super().__init__()
        self.seq_len, self.step_features = seq_len, step_features
        self.linear = nn.Linear(step_features, d_model)
        self.position = nn.Parameter(torch.zeros(seq_len, d_model))
        nn.init.normal_(self.position, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.view(x.shape[0], self.seq_len, self.step_features)) + self.position


class SequenceTransformer(nn.Module):
    def __init__(self, n_features: int, n_outputs: int, seq_len: int, d_model: int, n_heads: int, n_layers: int,
                 ffn_mult: int, dropout: float) -> None:
        super().__init__()
        self.embed: StepEmbedding | None = StepEmbedding(n_features // seq_len, seq_len, d_model)
        self.layers = nn.ModuleDict({str(i): Block(d_model, n_heads, ffn_mult, dropout) for i in range(n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(d_model)
        self.head: nn.Linear | None = nn.Linear(d_model, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each part is optional: a pipeline stage keeps only its own (see pipeline_stage).
        h = self.embed(x) if self.embed is not None else x
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h[:, -1]) if self.head is not None else h

    def pipeline_stage(self, lo: int, hi: int, first: bool, last: bool) -> None:
        """Keep blocks ``lo`` to ``hi - 1`` (by position), the embedding only on the first stage and the norm
        and head only on the last; names do not change, so the stages' state dicts add up to the model's."""
        for i, name in enumerate(list(self.layers)):
            if not lo <= i < hi:
                del self.layers[name]
        if not first:
            self.embed = None
        if not last:
            self.norm, self.head = None, None


def sequence_transformer(n_features: int, n_outputs: int, seq_len: int = 8, d_model: int = 64, n_heads: int = 4,
                         n_layers: int = 2, ffn_mult: int = 4, dropout: float = 0.0) -> nn.Module:
    """The transformer for ``seq_len`` steps of ``n_features // seq_len`` features each."""
    if n_features % seq_len:
        raise ValueError(f"{n_features} features are not {seq_len} steps of equal width: the dataset must hold "
                         f"seq_len (={seq_len}) step-major blocks of the same columns (see card_sequences)")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
    return SequenceTransformer(n_features, n_outputs, seq_len, d_model, n_heads, n_layers, ffn_mult, dropout)
