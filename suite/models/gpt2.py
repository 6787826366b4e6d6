"""GPT-2 small with Hugging Face's ``GPT2LMHeadModel`` parameter names and shapes.

Written here (``transformers`` is optional, see ``suite.models.hf``), so that the module tree
and ``state_dict`` keys are those of ``GPT2LMHeadModel``: ``transformer.wte``/``wpe``
embeddings, ``transformer.h.N`` blocks (``ln_1``, ``attn.c_attn``, ``attn.c_proj``,
``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``), ``transformer.ln_f`` and ``lm_head``, whose weight
*is* ``transformer.wte.weight`` (one parameter tensor, counted and reduced once).  The
projections are Hugging Face's ``Conv1D``: weight stored ``(in, out)``.

Pre-LayerNorm blocks (eps 1e-5), GELU with the tanh approximation (``gelu_new``), causal
self-attention, GPT-2's published dropout 0.1 (``embd_pdrop``, ``attn_pdrop``, ``resid_pdrop``: after the
embeddings, on the attention weights, after each residual projection; Hugging Face's module names
``drop``, ``resid_dropout``, ``dropout``); the output is the logits ``(batch, seq, vocab)`` and the
loss next-token cross-entropy (``SyntheticTokens`` already shifts its targets by one).  The check
replays each rank's dropout masks (``suite.runtime.rng``).
Initialisation follows Hugging Face's: normal(0, 0.02) weights and embeddings, zero biases,
LayerNorm 1/0, and the residual projections (``c_proj``) at 0.02 / sqrt(2 · layers).

At 12 layers, d_model 768, 12 heads, 1024 positions and vocab 50257: 148 parameter tensors,
124,439,808 parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import ModelSpec, _tokens

__all__ = ["GPT2Dims", "GPT2LMHeadModel", "Conv1D", "SIZES", "gpt2_spec", "GPT2_SMALL"]


@dataclass(frozen=True)
class GPT2Dims:
    vocab: int = 50257
    positions: int = 1024  # the position table's length (n_positions)
    d_model: int = 768
    layers: int = 12
    heads: int = 12
    eps: float = 1e-5
    dropout: float = 0.1  # embd_pdrop = attn_pdrop = resid_pdrop, as published


GPT2_SMALL = GPT2Dims()


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: ``x @ weight + bias`` with ``weight`` of shape ``(in, out)``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], self.weight.shape[1])


class GPT2Attention(nn.Module):
    def __init__(self, d: GPT2Dims):
        super().__init__()
        if d.d_model % d.heads:
            raise ValueError(f"d_model {d.d_model} is not a multiple of heads {d.heads}")
        self.heads = d.heads
        self.attn_pdrop = d.dropout
        self.c_attn = Conv1D(d.d_model, 3 * d.d_model)
        self.c_proj = Conv1D(d.d_model, d.d_model)
        self.resid_dropout = nn.Dropout(d.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_pdrop if self.training else 0.0,
                                           is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class GPT2MLP(nn.Module):
    def __init__(self, d: GPT2Dims):
        super().__init__()
        self.c_fc = Conv1D(d.d_model, 4 * d.d_model)
        self.c_proj = Conv1D(4 * d.d_model, d.d_model)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class GPT2Block(nn.Module):
    def __init__(self, d: GPT2Dims):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d.d_model, eps=d.eps)
        self.attn = GPT2Attention(d)
        self.ln_2 = nn.LayerNorm(d.d_model, eps=d.eps)
        self.mlp = GPT2MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, d: GPT2Dims):
        super().__init__()
        self.wte = nn.Embedding(d.vocab, d.d_model)
        self.wpe = nn.Embedding(d.positions, d.d_model)
        self.drop = nn.Dropout(d.dropout)
        self.h = nn.ModuleList(GPT2Block(d) for _ in range(d.layers))
        self.ln_f = nn.LayerNorm(d.d_model, eps=d.eps)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.wpe.num_embeddings:
            raise ValueError(f"sequence of {t} tokens is longer than the position table ({self.wpe.num_embeddings})")
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """``tokens (batch, seq) -> logits (batch, seq, vocab)``; ``lm_head.weight`` is ``transformer.wte.weight``."""

    def __init__(self, dims: GPT2Dims = GPT2_SMALL):
        super().__init__()
        self.dims = dims
        self.transformer = GPT2Model(dims)
        self.lm_head = nn.Linear(dims.d_model, dims.vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one tensor
        self._init_weights()

    def _init_weights(self) -> None:
        for name, m in self.named_modules():
            if isinstance(m, (Conv1D, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            if isinstance(m, Conv1D):
                nn.init.zeros_(m.bias)
                if name.endswith("c_proj"):  # GPT-2's scaled residual projections
                    nn.init.normal_(m.weight, std=0.02 / math.sqrt(2 * self.dims.layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.transformer(tokens))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (the dataset's targets are the inputs shifted by one)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- the workload at each size ------------------------------------------------------------------
# full: GPT-2 small at its context (1024 tokens), 8 sequences per rank.
# cpu:  the same module and parameters (vocab 50257, position table 1024 long: 124,439,808
#       parameters, 474.7 MiB of fp32 gradients); only the sequence and the batch shrink.
# tiny: for tests: the same module tree at 2 layers, d_model 32, vocab 256.
class GPT2Size(NamedTuple):
    """What a size sets: the layout (``dims``), the sequence length, the batch per rank, the synthetic set."""

    dims: GPT2Dims
    seq_len: int
    per_rank_batch: int
    dataset_size: int


SIZES: dict[str, GPT2Size] = {
    "full": GPT2Size(GPT2_SMALL, 1024, 8, 256),
    "cpu": GPT2Size(GPT2_SMALL, 64, 2, 256),
    "tiny": GPT2Size(GPT2Dims(vocab=256, positions=64, d_model=32, layers=2, heads=2), 16, 4, 256),
}


def gpt2_spec(size: str = "cpu"):
    """GPT-2 small at ``size`` (see :data:`SIZES`); data: ``SyntheticTokens`` with the model's vocab.

    ``cpu`` (64 tokens, batch 2 per rank), measured once on the 2-core machine shared with other
    jobs, world 2, one thread per rank: 1.7 s per step of compute alone, 2.2 s with plain data
    parallel (148 allreduces, 474.7 MiB) at load average ~4, ~11 s at load ~8.  Peak 1.9 GB per rank.
    """
    s = SIZES[size]
    dims, seq = s.dims, s.seq_len
    return ModelSpec(
        "gpt2", lambda: GPT2LMHeadModel(dims), lm_loss, _tokens(dims.vocab, seq), "tokens", size,
        s.per_rank_batch, dataset_size=s.dataset_size,
        description=(f"GPT-2 ({dims.layers} layers, d_model {dims.d_model}, {dims.heads} heads, vocab {dims.vocab}, "
                     f"{dims.positions} positions, tied embeddings), {seq} tokens"),
    )
