"""``--list-models`` and ``--list-meshes``, and the README's model table: every model of every
registered family with its size, and the mesh presets."""

from __future__ import annotations

from colossal_jax.config import describe_preset, list_presets, param_count


def model_rows() -> list[dict]:
    """Every model of every family (registration order): name, family, paper, task, layers,
    hidden, heads and the parameters a run with the family's default data trains
    (:func:`colossal_jax.data.tasks.sized_for_default_data`), plus the config's own count where its
    vocabulary differs."""
    from colossal_jax.config.families import FAMILIES
    from colossal_jax.data.tasks import sized_for_default_data

    rows = []
    for family in FAMILIES.values():
        for name, m in family.sizes.items():
            sized = sized_for_default_data(family.task, m)
            rows.append(
                {
                    "name": name,
                    "family": family.name,
                    "paper": family.paper,
                    "task": family.task,
                    "layers": m.n_layer,
                    "hidden": m.n_embd,
                    "heads": m.n_head,
                    "params": param_count(sized),
                    "own_vocab": m.vocab_size if sized.vocab_size != m.vocab_size else None,
                    "own_params": param_count(m),
                }
            )
    return rows


def list_models() -> list[str]:
    """``--list-models``: one line per model of every family (:func:`model_rows`)."""
    from colossal_jax.data.corpus import BYTE_VOCAB

    lines = [
        f"{'model':12s} {'family':6s} {'task':20s} {'layers':>6s} {'hidden':>6s} {'heads':>5s}  "
        "parameters with the family's default data, as a run prints them (text: the "
        f"{BYTE_VOCAB}-token byte vocabulary, masked LM with its special tokens; ViT: its "
        "image size and classes)"
    ]
    for r in model_rows():
        own = (
            f" ({r['own_params'] / 1e6:.2f}M with --set model.vocab_size={r['own_vocab']})"
            if r["own_vocab"] is not None
            else ""
        )
        lines.append(
            f"{r['name']:12s} {r['family']:6s} {r['task']:20s} {r['layers']:6d} "
            f"{r['hidden']:6d} {r['heads']:5d}  {r['params'] / 1e6:.2f}M{own}"
        )
    return lines


def model_table() -> str:
    """The README's model table (markdown) from :func:`model_rows`."""
    lines = [
        "| model | family | task | layers | hidden | heads | parameters (default data) | "
        "parameters (own vocabulary) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in model_rows():
        own = (
            f"{r['own_params'] / 1e6:,.2f}M ({r['own_vocab']:,})"
            if r["own_vocab"] is not None
            else ""
        )
        lines.append(
            f"| `{r['name']}` | {r['family']} | {r['task']} | {r['layers']} | {r['hidden']} | "
            f"{r['heads']} | {r['params'] / 1e6:,.2f}M | {own} |"
        )
    return "\n".join(lines)


def list_meshes() -> list[str]:
    """``--list-meshes``: one line per preset of ``meshes/`` (axes, modes, what it is for)."""
    head = f"{'preset':14s} {'axes (data=rest: the remaining devices)':50s} {'modes':24s} about"
    return [head] + [describe_preset(name) for name in list_presets()]
