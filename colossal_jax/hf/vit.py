"""ViT (``transformers.ViTForImageClassification``) <-> our ViT (``models/vit.py``) with
``class_bias=False`` (HF adds the patch convolution's bias to the patches only).

What maps to what (``L`` layers, hidden ``h``, patch ``p``, ``c`` channels, ``C`` classes; our
head and position table are padded to multiples of 16, ``V`` and ``T`` rows):

=======================================  ======================================================
ours                                     Hugging Face (``vit.`` prefix unless said)
=======================================  ======================================================
``patch_embed.kernel [p·p·c, h]``        ``embeddings.patch_embeddings.projection.weight
                                         [h, c, p, p]``, axes ``(2, 3, 1, 0)`` flattened: our
                                         patches are flattened row, column, channel
                                         (:func:`colossal_jax.data.images.patchify`)
``patch_bias.kernel [1, h]``             ``…projection.bias [h]``
``class_token.kernel [1, h]``            ``embeddings.cls_token [1, 1, h]``
``wpe.table [T, h]``                     ``embeddings.position_embeddings [1, P + 1, h]``; rows
                                         past ``P + 1`` zero (never looked up)
``blocks.layers.ln1/ln2.scale/bias``     ``encoder.layer.{i}.layernorm_before/_after``
``…attn.query/key/value.kernel/bias``    ``…attention.attention.query/key/value``, weightᵀ
``…attn.out.kernel/bias``                ``…attention.output.dense``, weightᵀ
``…mlp.up.kernel/bias``                  ``…intermediate.dense``, weightᵀ
``…mlp.down.kernel/bias``                ``…output.dense``, weightᵀ
``ln_f.scale/bias``                      ``layernorm.weight/bias``
``head.kernel [h, V]`` / ``head.bias``   ``classifier.weight [C, h]``ᵀ / ``classifier.bias``
                                         (no prefix); columns past ``C`` zero
=======================================  ======================================================

Config: ``image_size``, ``patch_size``, ``num_channels`` -> ``channels``, the labels
(``id2label``) -> ``num_classes``, ``intermediate_size`` -> ``mlp_ratio``, ``layer_norm_eps``
-> ``eps``, ``hidden_act`` ``"gelu"`` -> ``gelu="exact"`` (``gelu_pytorch_tanh`` -> ``"tanh"``).
Export keeps HF's columns and rows (the padding is never a class nor a position; trained
padding columns of the head are dropped).
"""

from __future__ import annotations

from typing import Any

from colossal_jax.config.families import config_class
from colossal_jax.hf.mapping import ParamMap, Piece, layer_pieces

MODEL_TYPE = "vit"
ARCHITECTURE = "ViTForImageClassification"
AUTO_CLASS = "AutoModelForImageClassification"
CONFIG_CLASS = "ViTConfig"
PREFIX = "vit."
IGNORED = ()

GELU = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
"""HF ``hidden_act`` -> our ``gelu``."""

SUPPORTED: dict[str, tuple[tuple[Any, ...], Any]] = {
    "hidden_act": (tuple(GELU), "gelu"),
    "qkv_bias": ((True,), True),
}

DEFAULTS = {
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}


def _classes(hf: dict[str, Any]) -> int:
    labels = hf.get("id2label")
    return len(labels) if labels else int(hf.get("num_labels", 2))


def overrides(hf: dict[str, Any]) -> dict[str, Any]:
    """Our ``ViTConfig`` fields from a ViT ``config.json`` (ValueError for one we lack)."""
    size = {k: int(hf.get(k) or v) for k, v in DEFAULTS.items()}
    h, inner = size["hidden_size"], size["intermediate_size"]
    if inner % h:
        raise ValueError(f"intermediate_size {inner} is not a multiple of hidden_size {h}")
    if size["image_size"] % size["patch_size"]:
        raise ValueError(f"patch_size {size['patch_size']} does not divide the image size")
    return {
        "image_size": size["image_size"],
        "patch_size": size["patch_size"],
        "channels": size["num_channels"],
        "num_classes": _classes(hf),
        "n_layer": size["num_hidden_layers"],
        "n_head": size["num_attention_heads"],
        "n_embd": h,
        "mlp_ratio": inner // h,
        "eps": float(hf.get("layer_norm_eps", 1e-12)),
        "gelu": GELU[hf.get("hidden_act", "gelu")],
        "class_bias": False,
    }


def tied(hf: dict[str, Any]) -> bool:
    return False


def hf_config(arch: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of our architecture (a ``ViTConfig`` as a dict); ValueError for one
    HF's ViT cannot express."""
    if arch.get("class_bias", True):
        raise ValueError(
            "model.class_bias=True adds the patch bias to the class token, which HF's ViT does "
            "not; train with --set model.class_bias=false to export"
        )
    h, classes = arch["n_embd"], arch["num_classes"]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "image_size": arch["image_size"],
        "patch_size": arch["patch_size"],
        "num_channels": arch["channels"],
        "hidden_size": h,
        "num_hidden_layers": arch["n_layer"],
        "num_attention_heads": arch["n_head"],
        "intermediate_size": arch["mlp_ratio"] * h,
        "hidden_act": "gelu" if arch["gelu"] == "exact" else "gelu_pytorch_tanh",
        "layer_norm_eps": arch["eps"],
        "qkv_bias": True,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "id2label": {str(i): f"LABEL_{i}" for i in range(classes)},
        "label2id": {f"LABEL_{i}": i for i in range(classes)},
        "dtype": "float32",
    }


def param_map(arch: dict[str, Any], *, tied: bool) -> ParamMap:
    """Our parameter paths -> HF tensors (``classifier.*`` without the ``vit.`` prefix)."""
    del tied
    cfg = config_class(CONFIG_CLASS)(**arch)
    h, p, c, classes = cfg.n_embd, cfg.patch_size, cfg.channels, cfg.num_classes
    e, layer = PREFIX + "embeddings.", PREFIX + "encoder.layer.{i}."
    projection = e + "patch_embeddings.projection."
    pmap: ParamMap = {
        "patch_embed.kernel": Piece(
            projection + "weight", flatten=(2, 3, 1, 0), hf_shape=(h, c, p, p)
        ),
        "patch_bias.kernel": Piece(projection + "bias", flatten=(0,), hf_shape=(h,)),
        "class_token.kernel": Piece(e + "cls_token", flatten=(0, 1, 2), hf_shape=(1, 1, h)),
        "wpe.table": Piece(
            e + "position_embeddings",
            flatten=(0, 1, 2),
            pad=(0, cfg.block_size),
            hf_shape=(1, cfg.seq_len, h),
        ),
        "ln_f.scale": Piece(PREFIX + "layernorm.weight"),
        "ln_f.bias": Piece(PREFIX + "layernorm.bias"),
        "head.kernel": Piece(
            "classifier.weight", transpose=True, pad=(1, cfg.vocab_size), hf_shape=(classes, h)
        ),
        "head.bias": Piece("classifier.bias", pad=(0, cfg.vocab_size), hf_shape=(classes,)),
    }
    linears = (
        ("attn.query", "attention.attention.query"),
        ("attn.key", "attention.attention.key"),
        ("attn.value", "attention.attention.value"),
        ("attn.out", "attention.output.dense"),
        ("mlp.up", "intermediate.dense"),
        ("mlp.down", "output.dense"),
    )
    pmap.update(
        layer_pieces(layer, (("ln1", "layernorm_before"), ("ln2", "layernorm_after")), linears)
    )
    return pmap
