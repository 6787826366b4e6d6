"""A small Transformer encoder language model (next-token prediction), dropout off."""
from __future__ import annotations

import torch
from torch import nn

from . import _TOY_SCALE, ModelSpec, _tokens

__all__ = ["TinyTransformer", "lm_loss", "transformer_spec"]


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 128, d_model: int = 64, heads: int = 4, ff: int = 128, layers: int = 2,
                 seq_len: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)  # True = masked
        self.causal_mask: torch.Tensor
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        x = self.encoder(x, mask=self.causal_mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def transformer_spec(size: str = "cpu"):
    """The registry's ``transformer`` at ``size``."""
    s = _TOY_SCALE[size]
    return ModelSpec("transformer", lambda: TinyTransformer(d_model=64 * s, ff=128 * s, layers=2 * s), lm_loss,
                     _tokens(128, 32), "tokens", size, 16, description="2-layer Transformer LM (vocab 128, 32 tokens)")
