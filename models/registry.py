"""The model zoo's families, registered into the library's registry.

Each family is declared once, here, as a :class:`colossal_jax.config.families.Family`: its config
class and sizes (``models/<family>_config.py``, JAX-free) and where its Flax module lives
(``models/<family>.py``, imported only when a run builds it). The installed distribution names this
module in the ``colossal_jax.families`` entry-point group (``pyproject.toml``), so the library
loads it the first time a model is looked up; the library itself never imports the zoo.

To add a family: write ``models/<name>_config.py`` and ``models/<name>.py``, then one
``register(Family(...))`` call below.
"""
from __future__ import annotations

from colossal_jax.config.families import Family, register
from colossal_jax_models.bert_config import BERT_MODELS, BertConfig
from colossal_jax_models.gpt_config import GPT_MODELS, GPTConfig
from colossal_jax_models.llama_config import LLAMA_MODELS, LlamaConfig
from colossal_jax_models.vit_config import VIT_MODELS, ViTConfig

register(
    Family(
        "gpt",
        "Radford et al. 2019; Brown et al. 2020",
        "causal_lm",
        GPTConfig,
        GPT_MODELS,
        "colossal_jax_models.gpt:GPT",
        # the GPT-3 sizes start from their paper's learning rates (Brown et al. 2020, table
        # 2.1): the library-wide 3e-3 spiked gpt3-xl's loss to 15-17 by step 4 on an H200
        size_defaults={
            name: {"optim.lr": lr}
            for name, lr in (
                ("gpt3-small", 6e-4), ("gpt3-medium", 3e-4), ("gpt3-large", 2.5e-4),
                ("gpt3-xl", 2e-4), ("gpt3-2.7b", 1.6e-4), ("gpt3-6.7b", 1.2e-4),
                ("gpt3-13b", 1e-4), ("gpt3-175b", 6e-5),
            )
        },  # fmt: skip
    )
)
register(
    Family(
        "bert",
        "Devlin et al. 2019",
        "masked_lm",
        BertConfig,
        BERT_MODELS,
        "colossal_jax_models.bert:Bert",
    )
)
register(
    Family(
        "vit",
        "Dosovitskiy et al. 2021",
        "image_classification",
        ViTConfig,
        VIT_MODELS,
        "colossal_jax_models.vit:ViT",
        train_defaults={"data": "shapes"},
        size_defaults={
            "vit-tiny": {
                "data": "digits",
                "seq_len": VIT_MODELS["vit-tiny"].seq_len,
                "steps": 200,
                "batch_size": 120,
                "eval_every": 50,
                "optim.lr": 3e-3,
                "optim.warmup_steps": 20,
            },
            **{n: {"seq_len": m.seq_len} for n, m in VIT_MODELS.items() if n != "vit-tiny"},
        },
    )
)
register(
    Family(
        "llama",
        "Touvron et al. 2023; Dubey et al. 2024",
        "causal_lm",
        LlamaConfig,
        LLAMA_MODELS,
        "colossal_jax_models.llama:Llama",
    )
)
