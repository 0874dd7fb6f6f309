"""Sampling text from a causal language model checkpoint, on any mesh.

The run is rebuilt from the checkpoint's metadata (its architecture) on the mesh asked for, with
the training machinery: one plan per window shape (:func:`colossal_jax.checks.resolve.resolve`,
where the mesh and the model are checked) built by :func:`colossal_jax.training.run.build` (mesh,
tensor layout, sequence mode, parameter shardings); only the parameters are restored
(:func:`checkpoint.restore_params`), straight into those shardings. Each new token is one jitted
forward of the model as it trains (every layer routed to the layout), followed by temperature /
top-k sampling.

Decoding recomputes the whole window: the sequence is a fixed ``S = min(trained length,
round_up(prompt + new tokens))`` padded tokens (one compile; the trained length is the
checkpoint's ``seq_len``, at most ``block_size``: later positions were never trained), and every
new token runs the model
over all ``S`` positions, reading the logits at the last real one (causal attention makes the
padding invisible). That costs about ``2·N·S`` FLOPs per token (``N`` parameters) plus
attention over ``S²``, where a KV cache would cost ``2·N`` plus ``S``: fine for the small models
trained here, wasteful for long outputs of big ones (no KV cache yet). Past ``S`` the window
slides: the oldest tokens are dropped and positions restart at its start.

The byte tokenizer of the text corpora (:mod:`colossal_jax.data.corpus`) encodes the prompt and
decodes the output; ids beyond 255 (a model of a bigger vocabulary) print as ``<|id|>``.
Sampling is deterministic for a seed on a given mesh: step ``i`` draws with
``fold_in(key(seed), i)``; batch rows are padded up to the mesh's batch shards and dropped.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colossal_jax.config import ConfigError, OptimConfig, ParallelConfig, TrainConfig
from colossal_jax.config.flags import flag, values_of
from colossal_jax.config.parallel_rules import uses_zigzag
from colossal_jax.config.tensor_split import batch_shards
from colossal_jax.config.train_rules import check_sampling


@dataclass(frozen=True)
class Sampling:
    """How to sample.

    Attributes:
      max_new_tokens: tokens to add to the prompt.
      temperature: logits are divided by it; 0 takes the most likely token (greedy).
      top_k: sample among the ``k`` most likely tokens only (None: all).
      seed: seeds the draws (the same seed, mesh and prompt give the same text).
      num_samples: independent samples of the prompt (batch rows).
    """

    max_new_tokens: int = flag(200, "tokens to generate")
    temperature: float = flag(0.8, "0: greedy")
    top_k: int | None = flag(None, "sample among the k most likely tokens")
    seed: int = flag(0, "seeds the draws")
    num_samples: int = flag(1, "samples of the prompt")


def saved_config(meta: dict) -> TrainConfig:
    """The :class:`TrainConfig` a checkpoint's metadata records (fields this version lacks are
    dropped, missing ones take their defaults)."""

    def known(cls, values: dict) -> dict:
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in values.items() if k in names}

    saved = dict(meta["config"])
    optim = OptimConfig(**known(OptimConfig, saved.pop("optim", {})))
    parallel = ParallelConfig(**known(ParallelConfig, saved.pop("parallel", {})))
    return TrainConfig(**known(TrainConfig, saved), optim=optim, parallel=parallel)


def window(prompt_len: int, new: int, block_size: int, multiple: int) -> int:
    """``S``: prompt plus new tokens rounded up to ``multiple`` (what the sequence split
    needs), at most ``block_size`` (rounded down to ``multiple``)."""
    cap = block_size // multiple * multiple
    return min(cap, math.ceil((prompt_len + new) / multiple) * multiple)


class Sampler:
    """A checkpoint's parameters in a mesh, and the compiled next-token step.

    ``Sampler(checkpoint_dir, parallel, devices=n)`` restores the latest checkpoint that can be
    read (a damaged newer one is skipped with a warning on stderr and left in place), or
    ``step``, into ``parallel``'s mesh (default: one device; ``devices`` defaults to the mesh's
    size, the first devices); :meth:`sample` generates from a prompt."""

    def __init__(
        self,
        checkpoint_dir: str,
        parallel: ParallelConfig | None = None,
        *,
        devices: int | None = None,
        step: int | None = None,
    ):
        from colossal_jax.checks.preflight import latest_checkpoint_meta
        from colossal_jax.training.checkpoint import check_step

        check_step(checkpoint_dir, step)
        found = latest_checkpoint_meta(checkpoint_dir)
        if found is None:
            raise ConfigError(
                f"--checkpoint-dir {checkpoint_dir} holds no checkpoint; train one with "
                f"python scripts/train.py --checkpoint-dir {checkpoint_dir}"
            )
        self.meta = found[1]
        arch = self.meta.get("architecture")
        if not isinstance(arch, dict):
            raise ConfigError(
                f"the checkpoint in {checkpoint_dir} records no architecture (written by an "
                "older version); resume and save it with this version"
            )
        base = saved_config(self.meta)
        self.parallel = parallel if parallel is not None else ParallelConfig()
        self.base = dataclasses.replace(
            base,
            model_overrides=dict(arch),  # the checkpoint's resolved model, whatever the data
            data="synthetic",
            init_from_hf=None,
            parallel=self.parallel,
            devices=devices if devices is not None else self.parallel.size,
            checkpoint_dir=None,
            metrics_file=None,
            tensorboard_dir=None,
            eval_every=0,
            grad_accum=1,
            device_batch=None,
            remat="none",
            offload="none",
            precision="fp32",
            steps=1,
        )
        self.checkpoint_dir = checkpoint_dir
        self.step = step
        self._runs: dict[tuple[int, int], Any] = {}
        self._steps: dict[tuple, Callable] = {}
        self._params: Any = None

    @property
    def max_window(self) -> int:
        """The longest window: the sequence length the checkpoint trained on (positions beyond
        it were never trained), at most the model's ``block_size``."""
        block = int(self.meta["architecture"]["block_size"])
        return min(block, int(self.meta["config"].get("seq_len", block)))

    @property
    def vocab_size(self) -> int:
        return int(self.meta["architecture"]["vocab_size"])

    def _build(self, rows: int, seq_len: int, sampling: Sampling):
        """The run (mesh, shardings) for ``rows × seq_len`` windows, the restored parameters
        and the jitted step of ``sampling``; each built once, from its one resolved plan."""
        import jax

        from colossal_jax.checks.resolve import resolve
        from colossal_jax.runtime.devices import current_devices
        from colossal_jax.training.checkpoint import abstract_like, restore_params
        from colossal_jax.training.run import build

        shape = (rows, seq_len)
        if shape not in self._runs:
            window_cfg = dataclasses.replace(self.base, batch_size=rows, seq_len=seq_len)
            run = build(resolve(window_cfg, current_devices()))
            if self._params is None:  # the window shape changes no sharding: restore once
                target = abstract_like(run.abstract_params, run.param_shardings)
                self._params, _ = restore_params(self.checkpoint_dir, target, self.step)
            self._runs[shape] = run
        run = self._runs[shape]
        key = (shape, sampling.temperature, sampling.top_k)
        if key not in self._steps:
            self._steps[key] = jax.jit(next_token_fn(run, sampling.temperature, sampling.top_k))
        return run, self._params, self._steps[key]

    def sample(self, prompt: str | bytes, sampling: Sampling = Sampling()) -> list[str]:
        """``num_samples`` texts: the prompt followed by up to ``max_new_tokens`` tokens."""
        return [decode_ids(ids) for ids in self.sample_ids(prompt, sampling)]

    def sample_ids(self, prompt: str | bytes, sampling: Sampling = Sampling()) -> list[list[int]]:
        """The token ids of :meth:`sample` (prompt included)."""
        import jax
        import numpy as np

        from colossal_jax.data.corpus import encode

        ids = [int(t) for t in encode(prompt)]
        check_sampling(
            prompt_tokens=len(ids),
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            num_samples=sampling.num_samples,
            vocab_size=self.vocab_size,
            prompt_vocab=max(ids) + 1 if ids else 0,
        )
        par = self.parallel
        # rows: a multiple of the batch shards (and of a pipeline's microbatches, which the
        # rules ask of any batch, though the forward here does not run the schedule)
        shards = batch_shards(par) * par.num_microbatches
        rows = math.ceil(sampling.num_samples / shards) * shards
        # the checkpoint's recorded architecture decides, as the training run's model does
        zigzag = uses_zigzag(par, types.SimpleNamespace(**self.meta["architecture"]))
        multiple = 2 * par.seq if zigzag else par.seq
        s = window(len(ids), sampling.max_new_tokens, self.max_window, multiple)
        run, params, step = self._build(rows, s, sampling)
        order = np.arange(s)
        if zigzag:
            from colossal_jax.sequence.zigzag import zigzag_permutation

            order = zigzag_permutation(s, par.seq)
        column_of = np.argsort(order)  # where position t sits in the laid-out sequence
        positions = np.broadcast_to(np.arange(s, dtype=np.int32)[order], (rows, s))
        positions = jax.device_put(np.ascontiguousarray(positions), run.batch_sharding)
        out = [list(ids) for _ in range(rows)]
        context = np.zeros((rows, s), np.int32)
        n = min(len(ids), s)
        context[:, :n] = ids[len(ids) - n :]
        key = jax.random.key(sampling.seed)
        for i in range(sampling.max_new_tokens):
            tokens = jax.device_put(np.ascontiguousarray(context[:, order]), run.batch_sharding)
            nxt = np.asarray(
                step(params, tokens, positions, int(column_of[n - 1]), jax.random.fold_in(key, i))
            )
            for r in range(rows):
                out[r].append(int(nxt[r]))
            if n < s:
                context[:, n] = nxt
                n += 1
            else:  # the window is full: slide it by one token
                context = np.concatenate([context[:, 1:], nxt[:, None].astype(np.int32)], 1)
        return out[: sampling.num_samples]


def forward(run: Any) -> Callable:
    """``(params, tokens [b, S], positions [b, S]) -> logits [b, S, vocab]``: the model's
    forward in ``run``'s layout and sequence mode (not jitted)."""
    from flax import nnx

    from colossal_jax.layers import use_parallelism

    def logits(params, tokens, positions):
        with use_parallelism(run.layout, run.local_attention):
            return nnx.merge(run.graphdef, params)(tokens, positions)

    return logits


def next_token_fn(run: Any, temperature: float, top_k: int | None) -> Callable:
    """``(params, tokens [b, S], positions [b, S], column, key) -> next ids [b]``: the logits
    of :func:`forward` at ``column``, then temperature / top-k sampling."""
    import jax
    import jax.numpy as jnp

    model = forward(run)

    def step(params, tokens, positions, column, key):
        logits = model(params, tokens, positions)
        last = jax.lax.dynamic_index_in_dim(logits, column, axis=1, keepdims=False)
        last = last.astype(jnp.float32)
        if temperature == 0:
            return jnp.argmax(last, axis=-1).astype(jnp.int32)
        last = last / temperature
        if top_k is not None and top_k < last.shape[-1]:
            kth = jax.lax.top_k(last, top_k)[0][:, -1:]
            last = jnp.where(last < kth, -jnp.inf, last)
        return jax.random.categorical(key, last, axis=-1).astype(jnp.int32)

    return step


def decode_ids(ids: list[int]) -> str:
    """Bytes to text (invalid UTF-8 replaced); an id beyond a byte prints as ``<|id|>``."""
    out, run = [], bytearray()
    for t in ids:
        if t < 256:
            run.append(t)
            continue
        out.append(run.decode("utf-8", errors="replace"))
        out.append(f"<|{t}|>")
        run = bytearray()
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


# ---- command line -------------------------------------------------------------------------------


def build_parser():
    """The flags: the checkpoint and prompt, one per :class:`Sampling` field, and the mesh
    flags of ``train.py`` (:func:`colossal_jax.cli.parser.add_mesh_flags`)."""
    import argparse

    from colossal_jax.cli.parser import add_config_flag, add_mesh_flags, integer
    from colossal_jax.config.flags import flags_of

    p = argparse.ArgumentParser(
        prog="generate.py",
        description="Sample text from a causal LM checkpoint (GPT) on any mesh.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    a = p.add_argument
    a("--checkpoint-dir", required=True, help="the --checkpoint-dir of a training run")
    a("--prompt", required=True, help="text the samples continue (byte tokens)")
    for f in flags_of(Sampling):
        add_config_flag(p, f)
    a("--step", type=integer, default=None, help="checkpoint step (default: the latest)")
    add_mesh_flags(p, cpu_devices=1)
    return p


def parallel_from_args(args, n_devices: int) -> ParallelConfig:
    """The mesh of ``--mesh/--tensor-mode/--tensor-depth/--seq-mode``, read as ``train.py``
    reads them (:func:`colossal_jax.cli.configure.parallel_config`) on ``n_devices``, for
    sampling: no ZeRO (inference keeps whole parameters over data) and one microbatch per
    pipeline stage. Not validated: the plan of each window checks it
    (:meth:`Sampler._build`)."""
    from colossal_jax.cli.configure import parallel_config

    par = parallel_config(
        args.mesh,
        n_devices,
        args.tensor_depth,
        tensor_mode=args.tensor_mode,
        seq_mode=args.seq_mode,
    )
    return dataclasses.replace(par, zero=0, microbatches=par.pipe if par.pipelined else None)


def main(argv: list[str] | None = None) -> int:
    """``scripts/generate.py``: print each sample; exit 0, or 2 with one ``error:`` line."""
    from colossal_jax.cli.launch import simulate_host_devices

    try:
        args = build_parser().parse_args(argv)
        simulate_host_devices(args.devices if args.devices is not None else 1)
        import jax

        available = jax.device_count()
        if args.devices is not None and args.devices > available:
            raise ConfigError(f"--devices {args.devices} but only {available} are available")
        n = args.devices if args.devices is not None else available
        par = parallel_from_args(args, n)
        sampler = Sampler(args.checkpoint_dir, par, devices=n, step=args.step)
        sampling = Sampling(**values_of(Sampling, args))
        for i, text in enumerate(sampler.sample(args.prompt, sampling)):
            if sampling.num_samples > 1:
                print(f"--- sample {i}")
            print(text)
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
