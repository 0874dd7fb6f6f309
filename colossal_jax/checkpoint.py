"""Checkpoints with orbax: complete or ignored, resumable onto the same or another mesh.

A checkpoint holds the parameters, the optimizer state (which carries the step count of the
schedule), and JSON metadata: the step (which is also the data position, since batches are a pure
function of ``(seed, step)``), the seed, and the configuration that wrote it. Orbax writes each
step into a temporary directory and renames it when every array is on disk, so a run killed at
any instant leaves either a complete checkpoint or one that :class:`Checkpointer` never sees.
Saves are asynchronous: training continues while arrays are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from colossal_jax.config import ConfigError


class Checkpointer:
    """Save every ``every`` steps (and on demand); restore the latest complete step."""

    def __init__(self, directory: str | Path, every: int, *, max_to_keep: int = 3):
        self.directory = Path(directory).resolve()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,
            enable_async_checkpointing=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Restore ``step`` into the shardings of ``abstract_state`` (a tree of
        ``jax.ShapeDtypeStruct`` with ``sharding`` set), which may differ from those saved.

        A checkpoint whose arrays do not fit ``abstract_state`` (another model shape, vocabulary,
        optimizer or precision) is a one-line :class:`ConfigError` naming the first differing
        array, its saved and expected shape, checked against the stored metadata before any
        array is read; a mismatch the check misses is reported the same way when orbax refuses
        it."""
        saved = self.saved_shapes(step)
        if saved is not None:
            check_fits(saved, leaf_shapes(abstract_state), self.directory / str(step))
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    meta=ocp.args.JsonRestore(),
                ),
            )
        except (ValueError, TypeError, KeyError) as e:
            where = self.directory / str(step)
            if saved is not None:  # names the leaf if the metadata shows it after all
                check_fits(saved, leaf_shapes(abstract_state), where, strict=True)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ConfigError(
                f"the checkpoint {where} does not fit this run ({first}); resume it with the "
                "model, data, optimizer and precision that wrote it, or use another "
                "--checkpoint-dir"
            ) from None
        return restored["state"], dict(restored["meta"])

    def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]] | None:
        """``dotted path -> shape`` of the arrays saved at ``step``, from orbax's metadata (no
        array is read); None if the metadata cannot be read."""
        try:
            tree = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "state")
            return leaf_shapes(tree)
        except Exception:  # noqa: BLE001 - an unreadable layout is left to the restore itself
            return None

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Start an asynchronous save of ``step`` if it is due (or ``force``)."""
        if not force and step % self.every:
            return False
        if self.manager.latest_step() == step:
            return False
        return self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def close(self) -> None:
        """Wait for pending writes and release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct``s of ``tree`` placed in ``shardings`` (a restore target).

    ``shardings`` may be a prefix of ``tree`` (one sharding for a whole subtree)."""

    def place(sharding, subtree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), subtree
        )

    return jax.tree.map(
        place, shardings, tree, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)
    )


def _key(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """``dotted path -> shape`` of every array leaf of ``tree`` (arrays, ``ShapeDtypeStruct``s or
    orbax ``ArrayMetadata``), in orbax's naming: named-tuple fields by name, sequences by
    index, so a restore target and a checkpoint's metadata compare."""
    out: dict[str, tuple[int, ...]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        shape = getattr(leaf, "shape", None)
        if shape is None:
            continue
        out[".".join(_key(k) for k in path)] = tuple(int(n) for n in shape)
    return out


def check_fits(
    saved: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    where: Any,
    *,
    strict: bool = False,
) -> None:
    """Raise a one-line :class:`ConfigError` naming the first array whose saved shape differs
    from the expected one, or that only one side has. Unless ``strict``, trees that share no
    path at all are not judged (a naming this function does not know, not a mismatch)."""
    if not strict and not saved.keys() & expected.keys():
        return
    fix = (
        "resume it with the model, data, optimizer and precision that wrote it, or use another "
        "--checkpoint-dir"
    )
    for path, shape in expected.items():
        if path not in saved:
            raise ConfigError(
                f"the checkpoint {where} has no array {path} (this run expects shape "
                f"{shape}); {fix}"
            )
        if saved[path] != shape:
            raise ConfigError(
                f"the checkpoint {where} holds {path} with shape {saved[path]}, but this run "
                f"expects {shape}; {fix}"
            )
    for path, shape in saved.items():
        if path not in expected:
            raise ConfigError(
                f"the checkpoint {where} holds an array {path} {shape} that this run does not "
                f"have; {fix}"
            )
