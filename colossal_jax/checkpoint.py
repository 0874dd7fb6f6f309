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
        ``jax.ShapeDtypeStruct`` with ``sharding`` set), which may differ from those saved."""
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], dict(restored["meta"])

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
