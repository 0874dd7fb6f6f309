"""One training per checkpoint directory: a lock held while a run writes there.

The lock is ``DIR/.lock``, a file locked with ``fcntl.flock`` and holding the holder's PID and
host. The kernel releases a ``flock`` when its process ends however it ends (SIGKILL included),
so a lock is never left held by a dead run: a file that still names a PID but can be locked was
left by a run that was killed, and the next run takes it over with a note. A second run on a
directory whose lock is held stops with one line naming the holder. ``flock`` also works across
hosts on NFS (Linux emulates it with POSIX locks there); on file systems without locks the
directory is used unlocked, with a note. In a multi-process run only process 0 holds the lock
(the processes of one run share the directory; the others never write to it alone).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Callable
from pathlib import Path

from colossal_jax.config import ConfigError

LOCK_NAME = ".lock"


class DirectoryLock:
    """The lock of ``directory`` (created if needed), taken by :meth:`acquire`."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, note: Callable[[str], None]) -> None:
        """Take the lock, or raise a :class:`ConfigError` naming the run that holds it. A lock
        left by a killed run is taken over, with a ``note``."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(
                f"--checkpoint-dir {self.path.parent}: cannot create its lock file {self.path} "
                f"({e.strerror}); use a directory this user can write, or another "
                "--checkpoint-dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"--checkpoint-dir {self.path.parent} is in use by another training "
                    f"({_describe(_read(self.path))}); wait for it to end, stop it, or use "
                    "another --checkpoint-dir"
                ) from None
            note(f"{self.path.parent} cannot be locked ({e.strerror}); using it unlocked")
            return
        left = _read(self.path)
        if left:
            note(
                f"took over the lock of {self.path.parent} left by a run that is no longer "
                f"running ({_describe(left)})"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the file (a clean end leaves no holder named) and unlock it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the flock


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _describe(content: str) -> str:
    """``PID 123 on host h`` from the lock file's ``123 h`` (the PID unknown if unreadable)."""
    parts = content.split()
    if not parts or not parts[0].isdigit():
        return "PID unknown"
    return f"PID {parts[0]}" + (f" on host {parts[1]}" if len(parts) > 1 else "")
