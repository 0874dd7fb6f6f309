"""BERT (``transformers.BertForMaskedLM``) <-> our BERT (``models/bert.py``).

What maps to what (``L`` layers, hidden ``h``):

=========================================  ====================================================
ours                                       Hugging Face (``bert.`` prefix unless said)
=========================================  ====================================================
``wte.table [V, h]``                       ``embeddings.word_embeddings.weight [V, h]``; also
                                           the MLM decoder's weights (tied, as HF's)
``wpe.table [block_size, h]``              ``embeddings.position_embeddings.weight``
``wtt.kernel [types, h]``                  ``embeddings.token_type_embeddings.weight``
``ln_emb.scale/bias``                      ``embeddings.LayerNorm.weight/bias``
``…attn.query/key/value.kernel/bias``      ``encoder.layer.{i}.attention.self.query/key/value``,
                                           weightᵀ
``…attn.out.kernel/bias``                  ``…attention.output.dense``, weightᵀ
``blocks.layers.ln1.scale/bias``           ``…attention.output.LayerNorm``
``…mlp.up.kernel/bias``                    ``…intermediate.dense``, weightᵀ
``…mlp.down.kernel/bias``                  ``…output.dense``, weightᵀ
``blocks.layers.ln2.scale/bias``           ``…output.LayerNorm``
``transform.kernel/bias``                  ``cls.predictions.transform.dense`` (no prefix),
                                           weightᵀ
``ln_transform.scale/bias``                ``cls.predictions.transform.LayerNorm``
``decoder_bias [V]``                       ``cls.predictions.bias`` (``…decoder.bias`` is the
                                           same tensor)
=========================================  ====================================================

Config: ``max_position_embeddings`` -> ``block_size``, ``intermediate_size`` -> ``mlp_ratio``,
``layer_norm_eps`` -> ``eps``, ``hidden_act`` ``"gelu"`` -> ``gelu="exact"``
(``gelu_pytorch_tanh``/``gelu_new`` -> ``"tanh"``), ``sep_token_id`` (if the file has one) ->
``sep_token``. HF takes token types as an input (``token_type_ids``, zeros when absent); ours
are computed from the ``[SEP]`` tokens of each sequence
(:func:`colossal_jax_models.bert.segments`), the same
ids for a ``[CLS] A [SEP] B [SEP]`` input. The pooler and the next-sentence head of a
``BertForPreTraining`` file (``bert.pooler.*``, ``cls.seq_relationship.*``) have no use in masked
LM and are not read. Export writes ``BertForMaskedLM`` with no dropout.
"""

from __future__ import annotations

from typing import Any

from colossal_jax.hf.mapping import ParamMap, Piece, layer_pieces

MODEL_TYPE = "bert"
ARCHITECTURE = "BertForMaskedLM"
AUTO_CLASS = "AutoModelForMaskedLM"
CONFIG_CLASS = "BertConfig"
PREFIX = "bert."
IGNORED = (
    "embeddings.position_ids",  # a buffer in older files
    "cls.predictions.decoder.weight",  # the word embeddings again (tied)
    "cls.predictions.decoder.bias",  # cls.predictions.bias again
    "pooler.dense.weight",
    "pooler.dense.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
)

GELU = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
"""HF ``hidden_act`` -> our ``gelu``."""

SUPPORTED: dict[str, tuple[tuple[Any, ...], Any]] = {
    "hidden_act": (tuple(GELU), "gelu"),
    "position_embedding_type": (("absolute",), "absolute"),
    "tie_word_embeddings": ((True,), True),
    "is_decoder": ((False,), False),
    "add_cross_attention": ((False,), False),
}

DEFAULTS = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


def overrides(hf: dict[str, Any]) -> dict[str, Any]:
    """Our ``BertConfig`` fields from a BERT ``config.json`` (ValueError for one we lack)."""
    size = {k: int(hf.get(k) or v) for k, v in DEFAULTS.items()}
    h, inner = size["hidden_size"], size["intermediate_size"]
    if inner % h:
        raise ValueError(f"intermediate_size {inner} is not a multiple of hidden_size {h}")
    sep = hf.get("sep_token_id")
    fields = {
        "vocab_size": size["vocab_size"],
        "block_size": size["max_position_embeddings"],
        "n_layer": size["num_hidden_layers"],
        "n_head": size["num_attention_heads"],
        "n_embd": h,
        "mlp_ratio": inner // h,
        "type_vocab_size": size["type_vocab_size"],
        "eps": float(hf.get("layer_norm_eps", 1e-12)),
        "gelu": GELU[hf.get("hidden_act", "gelu")],
    }
    # a config.json without sep_token_id says nothing of it: --set model.sep_token may add it
    return fields if sep is None else {**fields, "sep_token": int(sep)}


def tied(hf: dict[str, Any]) -> bool:
    return True


def hf_config(arch: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of our architecture (a ``transformers`` ``BertConfig`` as a dict);
    ValueError for one HF's BERT cannot express."""
    if not arch["type_vocab_size"]:
        raise ValueError(
            "model.type_vocab_size=0 (no token-type embedding) has no Hugging Face BERT form; "
            "train with --set model.type_vocab_size=2 to export"
        )
    h = arch["n_embd"]
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": arch["vocab_size"],
        "hidden_size": h,
        "num_hidden_layers": arch["n_layer"],
        "num_attention_heads": arch["n_head"],
        "intermediate_size": arch["mlp_ratio"] * h,
        "hidden_act": "gelu" if arch["gelu"] == "exact" else "gelu_pytorch_tanh",
        "max_position_embeddings": arch["block_size"],
        "type_vocab_size": arch["type_vocab_size"],
        "layer_norm_eps": arch["eps"],
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    if arch.get("sep_token") is not None:
        config["sep_token_id"] = arch["sep_token"]
    return config


def param_map(arch: dict[str, Any], *, tied: bool) -> ParamMap:
    """Our parameter paths -> HF tensors (``cls.*`` without the ``bert.`` prefix)."""
    del tied
    e, layer = PREFIX + "embeddings.", PREFIX + "encoder.layer.{i}."
    head = "cls.predictions."
    pmap: ParamMap = {
        "wte.table": Piece(e + "word_embeddings.weight"),
        "wpe.table": Piece(e + "position_embeddings.weight"),
        "wtt.kernel": Piece(e + "token_type_embeddings.weight"),
        "ln_emb.scale": Piece(e + "LayerNorm.weight"),
        "ln_emb.bias": Piece(e + "LayerNorm.bias"),
        "transform.kernel": Piece(head + "transform.dense.weight", transpose=True),
        "transform.bias": Piece(head + "transform.dense.bias"),
        "ln_transform.scale": Piece(head + "transform.LayerNorm.weight"),
        "ln_transform.bias": Piece(head + "transform.LayerNorm.bias"),
        "decoder_bias": Piece(head + "bias"),
    }
    linears = (
        ("attn.query", "attention.self.query"),
        ("attn.key", "attention.self.key"),
        ("attn.value", "attention.self.value"),
        ("attn.out", "attention.output.dense"),
        ("mlp.up", "intermediate.dense"),
        ("mlp.down", "output.dense"),
    )
    norms = (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm"))
    pmap.update(layer_pieces(layer, norms, linears))
    return pmap
