"""What can go wrong with a checkpoint directory, told apart and said in one line.

- :class:`Damaged`: a checkpoint that cannot be read as it was written (a file truncated,
  emptied, garbled or removed; a numbered folder with no checkpoint in it). The trainer moves it
  aside and uses the one before it; readers skip it.
- A checkpoint that is whole but was written by another run (other shapes, optimizer or
  precision) is a :class:`~colossal_jax.config.ConfigError`, raised by
  :func:`colossal_jax.training.checkpoint.check_fits`: not damage, never moved.
- :class:`WriteFailed`: a save that could not be written (disk full, no permission): one line
  naming the directory and the bytes the checkpoint needs. Orbax writes in threads; their errors
  reach the main thread at the next save or wait, where they are raised as this. What orbax's
  threads print on the way (an ``absl`` log record with a traceback per thread, tensorstore
  callbacks that find orbax's event loop closed) is dropped by :func:`quiet_orbax`.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import jax

from colossal_jax.config import ConfigError


class Damaged(Exception):
    """A checkpoint that cannot be read as it was written; the message says why (one line)."""


class WriteFailed(ConfigError):
    """A checkpoint could not be written; the message is the one line the user reads (exit 2,
    like every error the user can fix: free space, fix permissions or use another directory)."""


def reason(e: BaseException) -> str:
    """The first line of ``e``, short enough for a one-line message."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def state_bytes(state: Any) -> int:
    """The bytes of every array of ``state`` (global shapes): what its checkpoint holds."""
    return sum(
        math.prod(x.shape) * x.dtype.itemsize
        for x in jax.tree.leaves(state)
        if hasattr(x, "shape") and hasattr(x, "dtype")
    )


def write_failed(directory: Path, step: int | None, needed: int, e: BaseException) -> WriteFailed:
    """The one-line error of a save of ``step`` into ``directory`` that failed with ``e``."""
    try:
        free = f"; {_mib(shutil.disk_usage(directory).free)} is free there"
    except OSError:
        free = ""
    what = f"the checkpoint of step {step}" if step is not None else "a checkpoint"
    return WriteFailed(
        f"cannot write {what} to {directory} ({_why(e)}): it needs about {_mib(needed)} "
        f"({needed:,} bytes){free}; free space or fix the permissions there, or use another "
        "--checkpoint-dir (the checkpoints already there are untouched)"
    )


def _why(e: BaseException) -> str:
    """The cause of a failed write in a few words: the OS's words where the error carries them
    (tensorstore's messages end in ``[os_error_code='28']``)."""
    text = str(e)
    for code, words in (("28", "no space left on device"), ("13", "permission denied")):
        if f"os_error_code='{code}'" in text or f"[Errno {code}]" in text:
            return words
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return reason(e)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class _OrbaxErrors(logging.Filter):
    """Drops orbax's warning and error records, and asyncio's about orbax's tasks and
    tensorstore's futures (``Task/Future exception was never retrieved``): a failed write (a
    traceback per writer thread and task) is raised again in the main thread, and a damaged
    step (``Metadata file does not exist``) is found by the restore; each ends in one line of
    ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        tb = record.exc_info[2] if record.exc_info else None
        return not (
            "/orbax/" in record.pathname
            or "/orbax/" in text
            or "OCDBT" in text  # a tensorstore future's error: orbax is its only user here
            or "TensorStore" in text
            or _from_orbax(None, tb)
        )


def quiet_orbax() -> None:
    """Install, once per process, the filter of orbax's warnings and errors on the ``absl`` and
    ``asyncio`` loggers, and the hook that drops tensorstore's callbacks into orbax's closed
    event loop (after a failed read or write tensorstore completes the operations orbax
    abandoned, and each callback prints a ``RuntimeError('Event loop is closed')`` traceback
    through ``sys.unraisablehook``, as do orbax's coroutines that were abandoned with an error of
    their own); anything else goes to the hook that was there."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxErrors) for f in logger.filters):
            logger.addFilter(_OrbaxErrors())
    previous = sys.unraisablehook
    if getattr(previous, "_colossal_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return
        if _from_orbax(unraisable.object, unraisable.exc_traceback):
            return  # another read or write of a failed restore or save, already reported
        previous(unraisable)

    hook._colossal_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _from_orbax(obj: Any, tb: Any) -> bool:
    """Whether an unraisable exception came from orbax: its object is one of orbax's
    coroutines, or its traceback passes through orbax's code."""
    code = getattr(obj, "cr_code", None)
    if code is not None and "/orbax/" in code.co_filename:
        return True
    while tb is not None:
        if "/orbax/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False
