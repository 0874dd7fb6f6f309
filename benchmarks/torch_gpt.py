"""The GPT of ``models/gpt.py`` in PyTorch, for a reference throughput figure.

Same parameter shapes, init distributions and math (learned positions, pre-LN, GeLU tanh,
untied LM head, the mean token cross-entropy over weighted tokens), attention through
``torch.nn.functional.scaled_dot_product_attention`` (causal), the model under
``torch.compile``. On CUDA the step runs under bf16 autocast (fp32 master weights, as the
library's ``--precision bf16``); on a CPU it runs fp32 in one process, which is a reference
figure only (the library's CPU runs simulate several devices on the same cores).

The optimizer is ``torch.optim.AdamW`` with the run's ``OptimConfig``: decay of matrices only,
global-norm clipping, and optax's ``warmup_cosine_decay_schedule`` (linear warm-up from 0, cosine
to ``min_lr_ratio·lr``), as ``colossal_jax/optim.py`` builds it for ``adamw``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from colossal_jax.config import OptimConfig
from colossal_jax_models.gpt_config import GPTConfig


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        h, w = cfg.n_embd, cfg.mlp_width
        self.heads = cfg.n_head
        self.ln1 = nn.LayerNorm(h, eps=cfg.eps)
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.out = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=cfg.eps)
        self.up = nn.Linear(h, w)
        self.down = nn.Linear(w, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.ln1(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = heads(self.query(y)), heads(self.key(y)), heads(self.value(y))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(o.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.position != "learned":
            raise ValueError("the PyTorch GPT has learned positions only (model.position=learned)")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self._init()

    def _init(self) -> None:
        """GPT-2 init as the library's: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
        biases 0, layer-norm scales 1."""
        out_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            elif name.endswith(("out.weight", "down.weight")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=0.02)

    def loss(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor,
    ) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x)).float()
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        w = weights.flatten().float()
        return (nll * w).sum() / w.sum().clamp(min=1.0)


def load_library_params(model: GPT, state: Any) -> None:
    """Copy the library's GPT parameters (an ``nnx.State``, layers stacked) into ``model``."""
    from colossal_jax_benchmarks.plain_jax_gpt import from_library

    plain = from_library(state)
    names = {  # torch name in a block -> plain name, transposed (a kernel) or not
        "ln1.weight": ("ln1_scale", False),
        "ln1.bias": ("ln1_bias", False),
        "query.weight": ("wq", True),
        "query.bias": ("bq", False),
        "key.weight": ("wk", True),
        "key.bias": ("bk", False),
        "value.weight": ("wv", True),
        "value.bias": ("bv", False),
        "out.weight": ("wo", True),
        "out.bias": ("bo", False),
        "ln2.weight": ("ln2_scale", False),
        "ln2.bias": ("ln2_bias", False),
        "up.weight": ("w_up", True),
        "up.bias": ("b_up", False),
        "down.weight": ("w_down", True),
        "down.bias": ("b_down", False),
    }

    def tensor(a, transpose: bool) -> torch.Tensor:
        a = np.asarray(a, np.float32)
        return torch.from_numpy(np.array(a.T if transpose else a, np.float32, copy=True))

    with torch.no_grad():
        model.wte.weight.copy_(tensor(plain["wte"], False))
        model.wpe.weight.copy_(tensor(plain["wpe"], False))
        model.ln_f.weight.copy_(tensor(plain["lnf_scale"], False))
        model.ln_f.bias.copy_(tensor(plain["lnf_bias"], False))
        model.lm_head.weight.copy_(tensor(plain["head"], True))
        for block, layer in zip(model.blocks, plain["layers"], strict=True):
            params = dict(block.named_parameters())
            for name, (key, transpose) in names.items():
                params[name].copy_(tensor(layer[key], transpose))


def lr_lambda(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """optax ``warmup_cosine_decay_schedule`` as ``colossal_jax.training.optim.schedule`` sets it
    up,
    divided by the peak (``LambdaLR`` multiplies the base rate)."""
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    decay = max(total_steps, warmup + 1)
    end = cfg.min_lr_ratio

    def f(step: int) -> float:
        if step < warmup:
            return step / warmup
        t = min(step - warmup, decay - warmup) / (decay - warmup)
        return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * t))

    return f


class TorchRun:
    """A compiled PyTorch training step on one device (``torch.compile`` of the loss; AdamW;
    bf16 autocast on CUDA, fp32 otherwise)."""

    def __init__(self, cfg: GPTConfig, optim: OptimConfig, total_steps: int):
        if optim.name != "adamw":
            raise ValueError(f"the PyTorch baseline has AdamW only, not {optim.name!r}")
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = GPT(cfg).to(self.device)
        self.optim, self.total_steps = optim, total_steps
        self.loss_fn = torch.compile(self.model.loss)
        self.reset()

    def reset(self, library_state: Any = None) -> None:
        """A fresh optimizer and schedule; with ``library_state``, the library's parameters."""
        if library_state is not None:
            load_library_params(self.model, library_state)
        o = self.optim
        params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
            ],
            lr=o.lr,
            betas=(o.b1, o.b2),
            eps=o.eps,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(o, self.total_steps))

    def put_batch(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v)).to(self.device) for k, v in batch.items()}

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns ``(loss, gradient norm before clipping)``."""
        self.opt.zero_grad(set_to_none=True)
        cuda = self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = self.loss_fn(
                batch["tokens"], batch["positions"], batch["targets"], batch["weights"]
            )
        loss.backward()
        clip = self.optim.clip_norm if self.optim.clip_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.opt.step()
        self.sched.step()
        return loss.detach(), norm.detach()
