"""Our checkpoint -> a Hugging Face directory (``config.json`` + ``model.safetensors``) that
``transformers`` loads (``AutoModelForCausalLM``, ``AutoModelForMaskedLM`` or
``AutoModelForImageClassification``, as the family's ``AUTO_CLASS`` says).

The checkpoint's JSON metadata names the model and its resolved architecture; the model zoo
(:mod:`colossal_jax_models.registry`) builds its parameter tree, and the family module
(:data:`colossal_jax.hf.FAMILIES`) turns the architecture into a HF config and its parameter
map into HF tensors. Only the parameters are read (not the optimizer state), as host arrays: no
device and no mesh are needed, and each HF tensor is assembled and written one at a time, so the
host holds the parameters plus one tensor. Values are written as stored (fp32), so importing the
export gives our parameters back bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from colossal_jax import hf
from colossal_jax.config import ConfigError
from colossal_jax.hf.load import dotted
from colossal_jax.hf.mapping import assemble, hf_shapes
from colossal_jax.hf.tensors import SAFETENSORS, write_safetensors
from colossal_jax.training.checkpoint import restore_params


def _family_and_arch(meta: dict) -> tuple[Any, dict]:
    from colossal_jax.config.families import model_config

    arch = meta.get("architecture")
    if not isinstance(arch, dict):
        raise ConfigError(
            "the checkpoint's metadata has no architecture (written before it was saved); "
            "re-save it with this version"
        )
    try:
        ours = model_config(meta["model"], **arch)
    except (KeyError, TypeError) as e:
        raise ConfigError(
            f"the checkpoint's model {meta.get('model')!r} is unknown ({e})"
        ) from None
    family = hf.family_of(ours)
    if family is None:
        raise ConfigError(
            f"model {meta['model']} ({type(ours).__name__}) has no Hugging Face mapping; "
            f"mapped families: {', '.join(hf.FAMILIES)}"
        )
    return family, arch


def export(checkpoint_dir: str | Path, out_dir: str | Path, step: int | None = None) -> Path:
    """Write checkpoint ``step`` (default: the latest that can be read; a damaged newer one is
    skipped with a warning on stderr and left in place) of ``checkpoint_dir`` as a Hugging Face
    directory ``out_dir``; returns the path of the safetensors file."""
    from colossal_jax.checks.preflight import latest_checkpoint_meta
    from colossal_jax.training.checkpoint import check_step

    check_step(checkpoint_dir, step)
    found = latest_checkpoint_meta(str(checkpoint_dir))
    if found is None:
        raise ConfigError(f"no checkpoint in {checkpoint_dir}; train with --checkpoint-dir")
    family, arch = _family_and_arch(found[1])
    try:
        config = family.hf_config(arch)
    except ValueError as e:
        raise ConfigError(
            f"{checkpoint_dir} cannot be exported to {family.MODEL_TYPE}: {e}"
        ) from None
    target = _abstract_params(found[1]["model"], arch)
    params, meta = restore_params(checkpoint_dir, target, step)
    flat = {dotted(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(params)}
    pmap = family.param_map(arch, tied=False)
    missing = sorted(set(flat) - set(pmap))
    if missing:
        raise ConfigError(f"the {family.MODEL_TYPE} map has no HF tensor for our {missing[0]}")
    tensors = hf_shapes(pmap, {k: v.shape for k, v in flat.items()})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SAFETENSORS
    write_safetensors(
        path,
        {name: (shape, np.float32) for name, (shape, _) in tensors.items()},
        lambda name: assemble(*tensors[name], pmap, flat.__getitem__),
    )
    config["colossal_jax"] = {
        "checkpoint": str(Path(checkpoint_dir).resolve()),
        "step": meta["step"],
    }
    (out / hf.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return path


def _abstract_params(model: str, arch: dict) -> Any:
    """The parameter tree of the checkpoint's model as ``ShapeDtypeStruct``s without a sharding
    (the restore returns host arrays)."""
    from flax import nnx

    from colossal_jax.config.families import family_of, model_config

    cfg = model_config(model, **arch)
    family = family_of(model)
    abstract = nnx.eval_shape(lambda: family.build(cfg, rngs=nnx.Rngs(0)))
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), nnx.state(abstract))


def main(argv: list[str] | None = None) -> int:
    """``scripts/export_hf.py CHECKPOINT_DIR OUT_DIR [--step N]``; exit status 0, or 2 with one
    ``error:`` line."""
    import argparse
    import sys

    p = argparse.ArgumentParser(
        prog="export_hf.py",
        description="Write a colossal-jax checkpoint as a Hugging Face directory (config.json + "
        "model.safetensors) that transformers' from_pretrained loads.",
    )
    p.add_argument("checkpoint_dir", help="the --checkpoint-dir of a training run")
    p.add_argument("out_dir", help="the Hugging Face directory to write (created if needed)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    args = p.parse_args(argv)
    try:
        path = export(args.checkpoint_dir, args.out_dir, args.step)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = json.loads((path.parent / hf.CONFIG).read_text())
    print(
        f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) and {hf.CONFIG}: "
        f"{config['architectures'][0]}, step {config['colossal_jax']['step']}; load it with "
        f"transformers.{hf.family(config['model_type']).AUTO_CLASS}.from_pretrained"
    )
    return 0
