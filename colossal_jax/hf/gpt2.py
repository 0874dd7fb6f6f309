"""GPT-2 (``transformers.GPT2LMHeadModel``) <-> our GPT (``models/gpt.py``).

What maps to what (``L`` layers, hidden ``h``):

===================================  ==========================================================
ours                                 Hugging Face
===================================  ==========================================================
``wte.table [V, h]``                 ``transformer.wte.weight [V, h]``
``wpe.table [block_size, h]``        ``transformer.wpe.weight [n_positions, h]``
``blocks.layers.ln1.scale/bias``     ``transformer.h.{i}.ln_1.weight/bias``, stacked over ``i``
``…attn.query/key/value.kernel``     columns ``[0,h) [h,2h) [2h,3h)`` of ``h.{i}.attn.c_attn.weight
[L, h, h]``                          [h, 3h]`` (``Conv1D``: ``[in, out]`` as ours, no transpose)
``…attn.query/key/value.bias``       the same thirds of ``h.{i}.attn.c_attn.bias [3h]``
``…attn.out.kernel/bias``            ``h.{i}.attn.c_proj.weight [h, h]`` / ``.bias``
``…ln2.scale/bias``                  ``h.{i}.ln_2.weight/bias``
``…mlp.up.kernel/bias``              ``h.{i}.mlp.c_fc.weight [h, 4h]`` / ``.bias``
``…mlp.down.kernel/bias``            ``h.{i}.mlp.c_proj.weight [4h, h]`` / ``.bias``
``ln_f.scale/bias``                  ``transformer.ln_f.weight/bias``
``lm_head.kernel [h, V]``            tied (HF's default): ``transformer.wte.weight`` transposed,
                                     copied (our head is untied); untied: ``lm_head.weight``ᵀ
===================================  ==========================================================

Config: ``n_positions`` -> ``block_size``, ``n_inner`` (None: ``4h``) -> ``mlp_ratio``,
``layer_norm_epsilon`` -> ``eps``; positions are learned. Our MLP's GeLU is the tanh
approximation, HF's ``gelu_new`` (or ``gelu_pytorch_tanh``), and attention scales by
``1/sqrt(head_dim)`` (``scale_attn_weights``). Export writes ``tie_word_embeddings: false``
so the trained head is saved as ``lm_head.weight`` (nothing is lost), and no dropout.
Older checkpoints hold the causal-mask buffers ``h.{i}.attn.bias``/``masked_bias``: ignored.
"""

from __future__ import annotations

from typing import Any

from colossal_jax.hf.mapping import ParamMap, Piece

MODEL_TYPE = "gpt2"
ARCHITECTURE = "GPT2LMHeadModel"
AUTO_CLASS = "AutoModelForCausalLM"
"""The ``transformers`` auto class that loads an export."""
CONFIG_CLASS = "GPTConfig"
"""Our config class (``colossal_jax_models.gpt_config``) this family maps to."""
PREFIX = "transformer."
"""The base model's prefix in ``GPT2LMHeadModel``'s names (absent in ``GPT2Model`` files)."""
IGNORED = (".attn.bias", ".attn.masked_bias")
"""Suffixes of tensors that are buffers, not parameters."""

SUPPORTED: dict[str, tuple[tuple[Any, ...], Any]] = {
    "activation_function": (("gelu_new", "gelu_pytorch_tanh"), "gelu_new"),
    "scale_attn_weights": ((True,), True),
    "scale_attn_by_inverse_layer_idx": ((False,), False),
    "add_cross_attention": ((False,), False),
}
"""HF config key -> (the values our model computes alike, HF's default when the key is absent)."""

DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
"""``GPT2Config``'s defaults, for a config.json that leaves a size out."""


def overrides(hf: dict[str, Any]) -> dict[str, Any]:
    """Our ``GPTConfig`` fields from a GPT-2 ``config.json`` (ValueError for a shape we lack)."""
    size = {k: int(hf.get(k) or v) for k, v in DEFAULTS.items()}
    h = size["n_embd"]
    inner = int(hf.get("n_inner") or 4 * h)
    if inner % h:
        raise ValueError(f"n_inner {inner} is not a multiple of n_embd {h} (our mlp_ratio)")
    return {
        "vocab_size": size["vocab_size"],
        "block_size": size["n_positions"],
        "n_layer": size["n_layer"],
        "n_head": size["n_head"],
        "n_embd": h,
        "mlp_ratio": inner // h,
        "eps": float(hf.get("layer_norm_epsilon", 1e-5)),
        "position": "learned",
    }


def tied(hf: dict[str, Any]) -> bool:
    return bool(hf.get("tie_word_embeddings", True))


def hf_config(arch: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of our architecture (a ``GPTConfig`` as a dict); ValueError for one
    GPT-2 cannot express."""
    if arch.get("position", "learned") != "learned":
        raise ValueError(
            f"model.position={arch['position']} has no GPT-2 equivalent (GPT-2 learns its "
            "positions); only GPTs with learned positions export"
        )
    h = arch["n_embd"]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": arch["vocab_size"],
        "n_positions": arch["block_size"],
        "n_embd": h,
        "n_layer": arch["n_layer"],
        "n_head": arch["n_head"],
        "n_inner": arch["mlp_ratio"] * h,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": arch["eps"],
        "scale_attn_weights": True,
        "tie_word_embeddings": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": "float32",
    }


def param_map(arch: dict[str, Any], *, tied: bool) -> ParamMap:
    """Our parameter paths -> HF tensors (names with the ``transformer.`` prefix)."""
    h = arch["n_embd"]
    t, layer = PREFIX, PREFIX + "h.{i}."
    pmap: ParamMap = {
        "wte.table": Piece(t + "wte.weight"),
        "wpe.table": Piece(t + "wpe.weight"),
        "ln_f.scale": Piece(t + "ln_f.weight"),
        "ln_f.bias": Piece(t + "ln_f.bias"),
        "lm_head.kernel": Piece(t + "wte.weight" if tied else "lm_head.weight", transpose=True),
    }
    for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
        pmap[f"blocks.layers.{ours}.scale"] = Piece(f"{layer}{theirs}.weight")
        pmap[f"blocks.layers.{ours}.bias"] = Piece(f"{layer}{theirs}.bias")
    for k, name in enumerate(("query", "key", "value")):
        for p in ("kernel", "bias"):
            hf = f"{layer}attn.c_attn.{'weight' if p == 'kernel' else 'bias'}"
            pmap[f"blocks.layers.attn.{name}.{p}"] = Piece(hf, cols=(k * h, (k + 1) * h))
    for ours, theirs in (
        ("attn.out", "attn.c_proj"),
        ("mlp.up", "mlp.c_fc"),
        ("mlp.down", "mlp.c_proj"),
    ):
        pmap[f"blocks.layers.{ours}.kernel"] = Piece(f"{layer}{theirs}.weight")
        pmap[f"blocks.layers.{ours}.bias"] = Piece(f"{layer}{theirs}.bias")
    return pmap
