"""Model configs as plain data, for code that names them without JAX: :class:`GPTConfig` (the
GPT family's config), the named sizes of every family :data:`MODELS` and :func:`model_config`.

A family's config lives in its own file (``models/gpt_config.py``, ``models/bert_config.py``,
``models/vit_config.py``) and the families are listed in :mod:`models.registry`; this module
keeps the names other code imports.
"""

from __future__ import annotations

from models.bert_config import BertConfig
from models.gpt_config import GPT_MODELS, GPTConfig
from models.registry import MODELS, family_of, model_config
from models.vit_config import ViTConfig

__all__ = [
    "GPT_MODELS",
    "MODELS",
    "BertConfig",
    "GPTConfig",
    "ViTConfig",
    "family_of",
    "model_config",
]
