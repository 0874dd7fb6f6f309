"""LLaMA (``transformers.LlamaForCausalLM``) <-> our LLaMA (``models/llama.py``).

What maps to what (``L`` layers, hidden ``h``, ``kv = n_kv_head · head_dim``, SwiGLU width
``w``); every HF linear is ``nn.Linear`` (``[out, in]``), so each kernel is its transpose:

=====================================  ========================================================
ours                                   Hugging Face
=====================================  ========================================================
``wte.table [V, h]``                   ``model.embed_tokens.weight``
``blocks.layers.attn_norm.scale``      ``model.layers.{i}.input_layernorm.weight``
``…attn.query.kernel [L, h, h]``       ``layers.{i}.self_attn.q_proj.weight``ᵀ
``…attn.key/value.kernel [L, h, kv]``  ``layers.{i}.self_attn.k_proj/v_proj.weight``ᵀ
``…attn.out.kernel [L, h, h]``         ``layers.{i}.self_attn.o_proj.weight``ᵀ
``…mlp_norm.scale``                    ``layers.{i}.post_attention_layernorm.weight``
``…mlp.gate/up.kernel [L, h, w]``      ``layers.{i}.mlp.gate_proj/up_proj.weight``ᵀ
``…mlp.down.kernel [L, w, h]``         ``layers.{i}.mlp.down_proj.weight``ᵀ
``norm.scale``                         ``model.norm.weight``
``lm_head.kernel [h, V]``              ``lm_head.weight``ᵀ; absent when tied
                                       (``tie_word_embeddings``: our ``tie_embeddings``)
=====================================  ========================================================

RoPE: ours pairs dimension ``i`` with ``i + d/2`` (:func:`colossal_jax.layers.rope.apply_rope`),
as HF's ``rotate_half``, with the same frequencies ``theta^(-2i/d)``: q/k rows map unpermuted.
Config: ``max_position_embeddings`` -> ``block_size``, ``num_key_value_heads`` -> ``n_kv_head``,
``rms_norm_eps`` -> ``eps``, ``rope_theta`` (``rope_parameters`` in transformers 5) ->
``rope_theta``. Only the default RoPE (no scaling), SiLU, no biases and ``head_dim = h / heads``
are computed alike.
"""

from __future__ import annotations

from typing import Any

from colossal_jax.hf.mapping import ParamMap, Piece

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
AUTO_CLASS = "AutoModelForCausalLM"
CONFIG_CLASS = "LlamaConfig"
PREFIX = "model."
IGNORED = ("rotary_emb.inv_freq",)

SUPPORTED: dict[str, tuple[tuple[Any, ...], Any]] = {
    "hidden_act": (("silu",), "silu"),
    "attention_bias": ((False,), False),
    "mlp_bias": ((False,), False),
    "pretraining_tp": ((1,), 1),
    "rope_scaling": ((None,), None),
}

DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}


def _rope_theta(hf: dict[str, Any]) -> float:
    rope = hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"rope_parameters.rope_type={kind!r}: only the default RoPE maps")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def overrides(hf: dict[str, Any]) -> dict[str, Any]:
    """Our ``LlamaConfig`` fields from a LLaMA ``config.json`` (ValueError for one we lack)."""
    size = {k: int(hf.get(k) or v) for k, v in DEFAULTS.items()}
    h, heads = size["hidden_size"], size["num_attention_heads"]
    head_dim = hf.get("head_dim")
    if head_dim is not None and int(head_dim) * heads != h:
        raise ValueError(
            f"head_dim={head_dim} is not hidden_size/num_attention_heads = {h // heads} "
            "(ours derives the head size)"
        )
    return {
        "vocab_size": size["vocab_size"],
        "block_size": size["max_position_embeddings"],
        "n_layer": size["num_hidden_layers"],
        "n_head": heads,
        "n_kv_head": int(hf.get("num_key_value_heads") or heads),
        "n_embd": h,
        "intermediate_size": size["intermediate_size"],
        "eps": float(hf.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(hf),
        "tie_embeddings": tied(hf),
    }


def tied(hf: dict[str, Any]) -> bool:
    return bool(hf.get("tie_word_embeddings", False))


def hf_config(arch: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of our architecture (a ``LlamaConfig`` as a dict)."""
    h, heads = arch["n_embd"], arch["n_head"]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": arch["vocab_size"],
        "hidden_size": h,
        "intermediate_size": arch["intermediate_size"],
        "num_hidden_layers": arch["n_layer"],
        "num_attention_heads": heads,
        "num_key_value_heads": arch["n_kv_head"],
        "head_dim": h // heads,
        "hidden_act": "silu",
        "max_position_embeddings": arch["block_size"],
        "rms_norm_eps": arch["eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": arch["rope_theta"]},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(arch["tie_embeddings"]),
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": "float32",
    }


def param_map(arch: dict[str, Any], *, tied: bool) -> ParamMap:
    """Our parameter paths -> HF tensors. Our model is tied or not as ``arch`` says (the rules
    set ``tie_embeddings`` from the directory), so ``tied`` adds nothing here."""
    del tied
    m, layer = PREFIX, PREFIX + "layers.{i}."
    pmap: ParamMap = {
        "wte.table": Piece(m + "embed_tokens.weight"),
        "norm.scale": Piece(m + "norm.weight"),
        "blocks.layers.attn_norm.scale": Piece(layer + "input_layernorm.weight"),
        "blocks.layers.mlp_norm.scale": Piece(layer + "post_attention_layernorm.weight"),
    }
    if not arch["tie_embeddings"]:
        pmap["lm_head.kernel"] = Piece("lm_head.weight", transpose=True)
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o")):
        pmap[f"blocks.layers.attn.{ours}.kernel"] = Piece(
            f"{layer}self_attn.{theirs}_proj.weight", transpose=True
        )
    for name in ("gate", "up", "down"):
        pmap[f"blocks.layers.mlp.{name}.kernel"] = Piece(
            f"{layer}mlp.{name}_proj.weight", transpose=True
        )
    return pmap
