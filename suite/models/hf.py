"""Hugging Face models built from their config class, random weights: ``hf:GPT2Config``, ``hf:BertConfig``.

``get_model("hf:GPT2Config", size)`` builds ``transformers.GPT2LMHeadModel`` and
``hf:BertConfig`` builds ``transformers.BertForMaskedLM``, at the dimensions, sequence length
and batch of the in-tree ``gpt2`` / ``bert`` at the same size (``suite.models.gpt2`` /
``suite.models.bert``), their published dropout (0.1) included.  Nothing is downloaded: the model is made from a config
object with random weights (``HF_HUB_OFFLINE=1`` is set for the process unless the user set
it), so this is the in-tree workload run through Hugging Face's own code.

The model is subclassed only to change its call: ``forward(tokens)`` returns the logits
tensor (``use_cache`` off), so the engine's loss — next-token cross-entropy for GPT-2 (the
data's targets are already shifted), cross-entropy over the masked positions for BERT — fits
the synthetic data.  Parameter names are Hugging Face's, which are also the in-tree models'.

``transformers`` is optional: without it a :class:`~suite.models.ModelError` says to
``pip install transformers``.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

from . import ModelError, ModelSpec, _tokens
from .bert import MASK_ID, _masked_tokens, masked_lm_loss
from .bert import SIZES as BERT_SIZES
from .gpt2 import SIZES as GPT2_SIZES
from .gpt2 import lm_loss

__all__ = ["hf_model", "HF_CONFIGS", "transformers_available"]

HF_CONFIGS = ("GPT2Config", "BertConfig")


def transformers_available() -> bool:
    try:
        return importlib.util.find_spec("transformers") is not None
    except (ImportError, ValueError):
        return False


def _import_transformers(ref: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # build from a config only: never reach for the hub
    try:
        import transformers
    except ImportError as exc:
        raise ModelError(f"model {ref!r} needs the transformers package, which does not import here ({exc}); "
                         f"install it with: pip install transformers") from None
    return transformers


@functools.cache
def _logits_classes() -> dict:
    """Subclasses of the Hugging Face models whose forward takes token ids and returns the logits."""
    transformers: Any = _import_transformers("hf:")

    class GPT2LogitsLMHeadModel(transformers.GPT2LMHeadModel):
        def forward(self, tokens):
            return super().forward(input_ids=tokens, use_cache=False).logits

    class BertLogitsForMaskedLM(transformers.BertForMaskedLM):
        def forward(self, tokens):
            return super().forward(input_ids=tokens).logits

    return {"GPT2Config": GPT2LogitsLMHeadModel, "BertConfig": BertLogitsForMaskedLM}


def _gpt2_config(transformers: Any, d: Any) -> Any:
    return transformers.GPT2Config(
        vocab_size=d.vocab, n_positions=d.positions, n_embd=d.d_model, n_layer=d.layers, n_head=d.heads,
        layer_norm_epsilon=d.eps, activation_function="gelu_new", resid_pdrop=d.dropout, embd_pdrop=d.dropout,
        attn_pdrop=d.dropout,
        bos_token_id=d.vocab - 1, eos_token_id=d.vocab - 1, tie_word_embeddings=True, use_cache=False,
    )


def _bert_config(transformers: Any, d: Any) -> Any:
    return transformers.BertConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads,
        intermediate_size=d.intermediate, max_position_embeddings=d.positions, type_vocab_size=d.token_types,
        layer_norm_eps=d.eps, hidden_act="gelu", hidden_dropout_prob=d.dropout,
        attention_probs_dropout_prob=d.dropout,
        pad_token_id=0, tie_word_embeddings=True,
    )


def hf_model(config_class_name: str, size: str = "cpu"):
    """The ``hf:<config_class_name>`` workload at ``size``; see the module docstring."""
    ref = f"hf:{config_class_name}"
    if config_class_name not in HF_CONFIGS:
        raise ModelError(f"model {ref!r}: allowed Hugging Face configs are "
                         f"{', '.join('hf:' + c for c in HF_CONFIGS)}")
    if not transformers_available():
        raise ModelError(f"model {ref!r} needs the transformers package, which is not installed; "
                         f"install it with: pip install transformers")
    s: Any  # the size's NamedTuple (GPT2Size or BertSize)
    if config_class_name == "GPT2Config":
        s = GPT2_SIZES[size]
        dims, seq = s.dims, s.seq_len
        make_config, loss, data, kind = _gpt2_config, lm_loss, _tokens(dims.vocab, seq), "tokens"
        what = (f"transformers GPT2LMHeadModel ({dims.layers} layers, d_model {dims.d_model}, vocab {dims.vocab}, "
                f"{dims.positions} positions), {seq} tokens")
    else:
        s = BERT_SIZES[size]
        dims, seq = s.dims, s.seq_len
        make_config, loss, data, kind = (_bert_config, masked_lm_loss, _masked_tokens(dims.vocab, seq, MASK_ID),
                                         "masked_tokens")
        what = (f"transformers BertForMaskedLM ({dims.layers} layers, hidden {dims.hidden}, vocab {dims.vocab}, "
                f"{dims.positions} positions), {seq} tokens, 15% masked")

    def build():
        transformers = _import_transformers(ref)
        model = _logits_classes()[config_class_name](make_config(transformers, dims))
        model.train()  # from_config models start in eval mode in some versions; the engine trains
        return model

    return ModelSpec(ref, build, loss, data, kind, size, s.per_rank_batch, dataset_size=s.dataset_size,
                     description=what)
