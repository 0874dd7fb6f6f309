#!/usr/bin/env python
"""Start N processes of ``scripts/train.py`` on this machine, as one multi-process run.

    python scripts/launch_local.py --processes 2 --devices-per-process 4 -- --steps 100 ...

Each process gets ``--coordinator 127.0.0.1:PORT --num-processes N --process-id i --devices K``
(a free port unless ``--port`` names one) followed by the flags after ``--``; every line it
prints comes out prefixed with ``[i]``. When a process exits non-zero the others get SIGTERM
(they save a checkpoint and stop), then SIGKILL after ``--grace`` seconds, and the launcher
exits with that process's status; it exits 0 when all of them succeed. SIGINT/SIGTERM to the
launcher are passed on to every process, and its status is then the first non-zero one.
Mistakes in the launcher's own flags print one ``error:`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "scripts" / "train.py"
OWN_FLAGS = ("--coordinator", "--num-processes", "--process-id", "--devices")


class LaunchError(Exception):
    """A mistake in the launcher's command line (exit status 2)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's flags (before ``--``) and the flags of train.py (after it)."""
    if "--" in argv:
        at = argv.index("--")
        own, rest = argv[:at], argv[at + 1 :]
    else:
        own, rest = argv, []

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise LaunchError(message)

    p = Parser(
        prog="launch_local.py",
        description="Run scripts/train.py as N local processes (flags for it after --).",
    )
    p.add_argument("--processes", type=int, required=True, help="how many processes, e.g. 2")
    p.add_argument("--devices-per-process", type=int, default=None, help="--devices of each")
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL")
    args = p.parse_args(own)
    if args.processes < 1:
        raise LaunchError(f"--processes {args.processes} must be at least 1; e.g. --processes 2")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        raise LaunchError(
            f"--devices-per-process {args.devices_per_process} must be at least 1; e.g. "
            "--devices-per-process 4"
        )
    if args.port is not None and not 0 < args.port < 65536:
        raise LaunchError(f"--port {args.port} must be in 1..65535; e.g. --port 12345")
    if args.grace < 0:
        raise LaunchError(f"--grace {args.grace} must be 0 or more; e.g. --grace 30")
    for word in rest:
        if word.split("=", 1)[0] in OWN_FLAGS:
            raise LaunchError(
                f"{word.split('=', 1)[0]} is set by the launcher (one per process); use "
                "--processes/--devices-per-process/--port before --"
            )
    return args, rest


def command(args: argparse.Namespace, rest: list[str], port: int, i: int) -> list[str]:
    """The command line of process ``i``."""
    cmd = [sys.executable, "-u", str(TRAIN), "--coordinator", f"127.0.0.1:{port}"]
    cmd += ["--num-processes", str(args.processes), "--process-id", str(i)]
    if args.devices_per_process is not None:
        cmd += ["--devices", str(args.devices_per_process)]
    return cmd + rest


def _pump(i: int, stream, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sys.stdout.write(f"[{i}] {line}")
            sys.stdout.flush()


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every process still running, then SIGKILL those left after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def launch(args: argparse.Namespace, rest: list[str]) -> int:
    """Run the processes; the exit status of the launcher."""
    port = args.port or free_port()
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # each process sets its own device count from --devices
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    for i in range(args.processes):
        p = subprocess.Popen(
            command(args, rest, port, i),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        procs.append(p)
        t = threading.Thread(target=_pump, args=(i, p.stdout, lock), daemon=True)
        t.start()
        pumps.append(t)
    status = 0
    received: list[int] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, status = failed[0]
                if any(c is None for c in codes):
                    with lock:
                        print(
                            f"launch_local: process {i} exited with status {status}; stopping "
                            "the others",
                            file=sys.stderr,
                            flush=True,
                        )
                _stop(procs, args.grace)
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.1)
    finally:
        _stop(procs, 0 if received else args.grace)
        for t in pumps:
            t.join(timeout=5)
    if status < 0:  # killed by a signal: report it as a shell does
        status = 128 - status
    return status


def main(argv: list[str] | None = None) -> int:
    """The launcher's command line; its exit status."""
    try:
        args, rest = parse(sys.argv[1:] if argv is None else argv)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return launch(args, rest)


if __name__ == "__main__":
    sys.exit(main())
