"""BERT-base with a masked-LM head, with Hugging Face's ``BertForMaskedLM`` parameter names.

Written here (``transformers`` is optional, see ``suite.models.hf``): ``bert.embeddings``
(``word_embeddings`` with padding id 0, ``position_embeddings``, ``token_type_embeddings``,
``LayerNorm``), ``bert.encoder.layer.N`` (``attention.self.query/key/value``,
``attention.output.dense`` + ``LayerNorm``, ``intermediate.dense``, ``output.dense`` +
``LayerNorm``; post-LayerNorm, eps 1e-12, exact GELU), no pooler (as in ``BertForMaskedLM``),
and ``cls.predictions``: ``transform`` (dense, GELU, LayerNorm), ``decoder`` whose weight *is*
``bert.embeddings.word_embeddings.weight`` and whose bias *is* ``cls.predictions.bias`` (each
one parameter tensor, counted and reduced once).

Every token is real (no padding mask) and of token type 0; BERT's published dropout 0.1
(``hidden_dropout_prob`` after the embeddings and before each residual LayerNorm,
``attention_probs_dropout_prob`` on the attention weights; Hugging Face's module names ``dropout``),
replayed by the check (``suite.runtime.rng``).  The output is the logits ``(batch, seq, vocab)``;
the loss is cross-entropy over the masked positions only (``SyntheticMaskedTokens`` marks the
others -100).  Initialisation follows Hugging Face's:
normal(0, 0.02) weights and embeddings (the padding row zero), zero biases, LayerNorm 1/0.

At 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, 512 positions, 2 token types:
202 parameter tensors, 109,514,298 parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..data.synthetic import SyntheticMaskedTokens
from . import ModelSpec

__all__ = ["BertDims", "BertForMaskedLM", "BERT_BASE", "SIZES", "bert_spec", "masked_lm_loss", "MASK_ID"]

MASK_ID = 103  # [MASK] in bert-base-uncased's vocabulary
PAD_ID = 0


@dataclass(frozen=True)
class BertDims:
    vocab: int = 30522
    positions: int = 512
    token_types: int = 2
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    eps: float = 1e-12
    dropout: float = 0.1  # hidden_dropout_prob = attention_probs_dropout_prob, as published


BERT_BASE = BertDims()


class BertEmbeddings(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.word_embeddings = nn.Embedding(d.vocab, d.hidden, padding_idx=PAD_ID)
        self.position_embeddings = nn.Embedding(d.positions, d.hidden)
        self.token_type_embeddings = nn.Embedding(d.token_types, d.hidden)
        self.LayerNorm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence of {t} tokens is longer than the position table "
                             f"({self.position_embeddings.num_embeddings})")
        pos = torch.arange(t, device=tokens.device)
        types = torch.zeros(t, dtype=torch.long, device=tokens.device)
        x = self.word_embeddings(tokens) + self.position_embeddings(pos) + self.token_type_embeddings(types)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        if d.hidden % d.heads:
            raise ValueError(f"hidden {d.hidden} is not a multiple of heads {d.heads}")
        self.heads = d.heads
        self.attn_pdrop = d.dropout
        self.query = nn.Linear(d.hidden, d.hidden)
        self.key = nn.Linear(d.hidden, d.hidden)
        self.value = nn.Linear(d.hidden, d.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_pdrop if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, c)


class BertSelfOutput(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.dense = nn.Linear(d.hidden, d.hidden)
        self.LayerNorm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.self = BertSelfAttention(d)
        self.output = BertSelfOutput(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.dense = nn.Linear(d.hidden, d.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.dense = nn.Linear(d.intermediate, d.hidden)
        self.LayerNorm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.dropout = nn.Dropout(d.dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.attention = BertAttention(d)
        self.intermediate = BertIntermediate(d)
        self.output = BertOutput(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(d) for _ in range(d.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class BertModel(nn.Module):
    """The encoder without a pooler (``BertForMaskedLM`` builds it with ``add_pooling_layer=False``)."""

    def __init__(self, d: BertDims):
        super().__init__()
        self.embeddings = BertEmbeddings(d)
        self.encoder = BertEncoder(d)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embeddings(tokens))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.dense = nn.Linear(d.hidden, d.hidden)
        self.LayerNorm = nn.LayerNorm(d.hidden, eps=d.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.transform = BertPredictionHeadTransform(d)
        self.decoder = nn.Linear(d.hidden, d.vocab, bias=False)
        self.bias = nn.Parameter(torch.zeros(d.vocab))
        self.decoder.bias = self.bias  # one tensor under two names, as in Hugging Face

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, d: BertDims):
        super().__init__()
        self.predictions = BertLMPredictionHead(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictions(x)


class BertForMaskedLM(nn.Module):
    """``tokens (batch, seq) -> logits (batch, seq, vocab)``; the decoder's weight is the word embeddings."""

    def __init__(self, dims: BertDims = BERT_BASE):
        super().__init__()
        self.dims = dims
        self.bert = BertModel(dims)
        self.cls = BertOnlyMLMHead(dims)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
                if m.padding_idx is not None:
                    with torch.no_grad():
                        m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.cls.predictions.bias)
        # The decoder's weight is the embedding table: re-initialised above as an nn.Linear's; put the
        # embedding's padding row back to zero.
        with torch.no_grad():
            self.bert.embeddings.word_embeddings.weight[PAD_ID].zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.cls(self.bert(tokens))


def masked_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the masked positions (targets -100 elsewhere are ignored)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def _masked_tokens(vocab: int, seq_len: int, mask_id: int):
    def make(n: int, seed: int):
        return SyntheticMaskedTokens(n, seed, vocab, seq_len, mask_id)

    return make


# ---- the workload at each size ------------------------------------------------------------------
# full: BERT-base at its full context (512 tokens), 8 sequences per rank.
# cpu:  the same module and parameters (vocab 30522, 512 positions: 109,514,298 parameters,
#       417.8 MiB of fp32 gradients); only the sequence and the batch shrink.
# tiny: for tests: the same module tree at 2 layers, hidden 32, vocab 256.
class BertSize(NamedTuple):
    """What a size sets: the layout (``dims``), the sequence length, the batch per rank, the synthetic set."""

    dims: BertDims
    seq_len: int
    per_rank_batch: int
    dataset_size: int


SIZES: dict[str, BertSize] = {
    "full": BertSize(BERT_BASE, 512, 8, 256),
    "cpu": BertSize(BERT_BASE, 64, 2, 256),
    "tiny": BertSize(BertDims(vocab=256, positions=64, hidden=32, layers=2, heads=2, intermediate=128), 16, 4, 256),
}


def bert_spec(size: str = "cpu"):
    """BERT-base masked LM at ``size`` (see :data:`SIZES`); data: ``SyntheticMaskedTokens`` ([MASK] = 103).

    ``cpu`` (64 tokens, batch 2 per rank), measured once on the 2-core machine shared with other
    jobs, world 2, one thread per rank, plain data parallel (202 allreduces, 417.8 MiB): ~2.5 s
    per step (2.1-2.9 s) at load average ~8, 5.8-6.6 s at load ~9 (compute alone then: 3.2-4.4 s,
    one 14 s outlier).  Peak 1.6 GB per rank.
    """
    s = SIZES[size]
    dims, seq = s.dims, s.seq_len
    return ModelSpec(
        "bert", lambda: BertForMaskedLM(dims), masked_lm_loss, _masked_tokens(dims.vocab, seq, MASK_ID),
        "masked_tokens", size, s.per_rank_batch, dataset_size=s.dataset_size,
        description=(f"BERT masked LM ({dims.layers} layers, hidden {dims.hidden}, {dims.heads} heads, FFN "
                     f"{dims.intermediate}, vocab {dims.vocab}, {dims.positions} positions, tied decoder), "
                     f"{seq} tokens, 15% masked"),
    )
