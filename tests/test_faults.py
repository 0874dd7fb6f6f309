"""Nothing lost, one line (issue 22): a damaged checkpoint of any kind is moved aside and the one
before it used; a directory in use by a live run is refused, a lock left by a killed run taken
over; a save that cannot be written (a full disk) is one ``error:`` line that touches nothing
already committed; readers fall back past a damaged checkpoint and list the steps there; a run
with nothing to do says so before compiling; a resumed run's summary reports only the
evaluations its metrics file holds."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colossal_jax import generate, hf_export
from colossal_jax.checks.preflight import latest_checkpoint_meta
from colossal_jax.cli import main
from colossal_jax.config import ConfigError
from colossal_jax.runtime.dirlock import DirectoryLock
from colossal_jax.training.trainer import train
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import crashlib  # noqa: E402

SMALL = [  # in-process: the 8 devices of conftest
    "--mesh", "data=8", "--set", "model.n_layer=1", "--set", "model.n_embd=64",
    "--batch-size", "8", "--seq-len", "32", "--no-progress", "--checkpoint-every", "2",
]  # fmt: skip


def _cfg(directory: Path, steps: int = 4, **kw):
    base = tiny_config(steps=steps, devices=8, data=8)
    return dataclasses.replace(base, checkpoint_dir=str(directory), checkpoint_every=2, **kw)


def _quiet(cfg, lines: list[str] | None = None):
    return train(cfg, progress=False, log=(lines.append if lines is not None else lambda _: None))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[float]]:
    """A run of 4 steps with checkpoints at steps 2 and 4, and its losses."""
    directory = tmp_path_factory.mktemp("faults") / "base"
    return directory, _quiet(_cfg(directory)).losses


def _copy(trained, tmp_path: Path) -> Path:
    directory = tmp_path / "ck"
    shutil.copytree(trained[0], directory)
    return directory


DAMAGES = {
    "empty meta/metadata": lambda d: (d / "4" / "meta" / "metadata").write_bytes(b""),
    "garbled state/_METADATA": lambda d: (d / "4" / "state" / "_METADATA").write_bytes(
        os.urandom(64)
    ),
    "no meta folder": lambda d: shutil.rmtree(d / "4" / "meta"),
    "no state folder": lambda d: shutil.rmtree(d / "4" / "state"),
    "no array folder": lambda d: shutil.rmtree(d / "4" / "state" / "ocdbt.process_0"),
    "metadata of another step": lambda d: (d / "4" / "meta" / "metadata").write_text(
        json.dumps({"step": 2})
    ),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_previous_used(
    trained, tmp_path, capsys, kind
):
    directory = _copy(trained, tmp_path)
    DAMAGES[kind](directory)
    capsys.readouterr()
    resumed = _quiet(_cfg(directory))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"warning: checkpoint step 4 in {directory.resolve()} is ")
    assert "moved to 4.corrupt" in err[0] and err[0].endswith("using step 2")
    assert (directory / "4.corrupt").is_dir()
    assert resumed.start_step == 2
    assert resumed.losses == trained[1][2:4]  # bit for bit


def test_a_stray_empty_step_folder_is_moved_aside(trained, tmp_path, capsys):
    directory = _copy(trained, tmp_path)
    (directory / "99").mkdir()
    capsys.readouterr()
    lines: list[str] = []
    resumed = _quiet(_cfg(directory), lines)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: checkpoint step 99 "), err
    assert err[0].endswith("moved to 99.corrupt); using step 4")
    assert resumed.start_step == 4 and not (directory / "99").exists()
    # nothing left to run: said before compiling (item 10)
    assert lines[-1] == "nothing to do: already at step 4"
    assert not any(line.startswith("compiled") for line in lines)


def test_with_every_checkpoint_damaged_the_run_starts_over(trained, tmp_path, capsys):
    directory = _copy(trained, tmp_path)
    for step in ("2", "4"):
        (directory / step / "meta" / "metadata").write_bytes(b"")
    capsys.readouterr()
    resumed = _quiet(_cfg(directory))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("starting from step 0" in line for line in err), err
    assert resumed.start_step == 0 and resumed.losses == trained[1]


def test_preflight_reads_the_newest_metadata_that_is_whole(tmp_path):
    for step, text in ((2, json.dumps({"step": 2})), (4, ""), (6, "[1]")):
        (tmp_path / str(step) / "meta").mkdir(parents=True)
        (tmp_path / str(step) / "meta" / "metadata").write_text(text)
    (tmp_path / "9").mkdir()  # a stray folder
    assert latest_checkpoint_meta(str(tmp_path)) == (2, {"step": 2})


def test_a_directory_in_use_is_refused_naming_the_holders_pid(tmp_path):
    """A second ``train.py`` on a directory a live process holds exits 2 in one line."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from colossal_jax.runtime.dirlock import "
         "DirectoryLock; DirectoryLock(sys.argv[1]).acquire(print); print('held', flush=True); "
         "time.sleep(120)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=crashlib.env(),
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = crashlib.command(4, tmp_path, tmp_path / "m.jsonl", 2)
        out = subprocess.run(cmd, env=crashlib.env(), capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    err = [line for line in out.stderr.splitlines() if not line.startswith("note:")]
    assert out.returncode == 2, out.stderr
    assert len(err) == 1 and err[0].startswith(f"error: --checkpoint-dir {tmp_path} is in use"), err
    assert f"PID {holder.pid} on host" in err[0]


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(tmp_path):
    (tmp_path / ".lock").write_text("999999999 elsewhere\n")
    notes: list[str] = []
    lock = DirectoryLock(tmp_path)
    lock.acquire(notes.append)
    assert notes == [
        f"took over the lock of {tmp_path} left by a run that is no longer running "
        "(PID 999999999 on host elsewhere)"
    ]
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    with pytest.raises(ConfigError, match=f"in use by another training \\(PID {os.getpid()}"):
        DirectoryLock(tmp_path).acquire(notes.append)
    lock.release()
    assert (tmp_path / ".lock").read_text() == ""  # a clean end names no holder
    DirectoryLock(tmp_path).acquire(notes.append)
    assert len(notes) == 1


def test_a_full_disk_is_one_error_line_and_keeps_what_was_committed(tmp_path, capfd, monkeypatch):
    from orbax.checkpoint._src.serialization import serialization

    monkeypatch.setattr(  # restored after the test: crashlib replaces it for the process
        serialization, "async_serialize_from_host", serialization.async_serialize_from_host
    )
    crashlib.full_disk_from(4)
    directory = tmp_path / "ck"
    capfd.readouterr()
    rc = main([*SMALL, "--steps", "6", "--checkpoint-dir", str(directory)])
    time.sleep(0.5)  # orbax's threads end; anything they print would be in stderr now
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if not line.startswith("note:")]
    assert rc == 2
    assert len(said) == 1, err[-3000:]
    assert said[0].startswith(
        f"error: cannot write the checkpoint of step 4 to {directory.resolve()} (no space left "
        "on device): it needs about 1.1 MiB (1,191,176 bytes)"
    ), said[0]
    assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["2"]
    monkeypatch.undo()
    capfd.readouterr()
    assert main([*SMALL, "--steps", "6", "--checkpoint-dir", str(directory)]) == 0
    assert "resumed from" in capfd.readouterr().out


def test_readers_fall_back_past_a_damaged_checkpoint_and_list_the_steps(trained, tmp_path, capsys):
    directory = _copy(trained, tmp_path)
    (directory / "4" / "state" / "_METADATA").write_bytes(os.urandom(64))
    sample = ["--checkpoint-dir", str(directory), "--prompt", "a", "--max-new-tokens", "2"]
    capsys.readouterr()
    assert generate.main(sample) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("using step 2"), err
    assert err[0].startswith(f"warning: checkpoint step 4 in {directory.resolve()} is ")
    assert (directory / "4").is_dir()  # a reader moves nothing
    assert hf_export.main([str(directory), str(tmp_path / "hf")]) == 0
    assert capsys.readouterr().err.strip().endswith("using step 2")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["colossal_jax"]["step"] == 2
    listed = "has no checkpoint of step 7; the steps there: 2, 4"
    assert generate.main([*sample, "--step", "7"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --step 7: {directory.resolve()} {listed}"
    ]
    assert hf_export.main([str(directory), str(tmp_path / "hf2"), "--step", "7"]) == 2
    assert capsys.readouterr().err.strip().endswith(listed)


def test_a_resumed_summary_reports_only_evaluations_the_metrics_file_holds(trained, tmp_path):
    directory = _copy(trained, tmp_path)
    metrics = tmp_path / "m.jsonl"
    resumed = _quiet(_cfg(directory, steps=6, eval_every=1, metrics_file=str(metrics)))
    written = {
        r["step"]: r["eval_loss"]
        for r in map(json.loads, metrics.read_text().splitlines())
        if "eval_loss" in r
    }
    assert resumed.start_step == 4
    assert resumed.eval_losses == sorted(written.items()) == [(5, written[5]), (6, written[6])]


@pytest.mark.slow
def test_fault_loop_ends_every_round_in_one_line_and_loses_nothing():
    """Acceptance 2 in small: three seeded rounds of ``scripts/fault_loop.py`` (20 by hand),
    its runs compiled at level 0 as the rest of the suite (``crashlib.env`` keeps the level)."""
    loop = str(ROOT / "scripts" / "fault_loop.py")
    out = subprocess.run(
        [sys.executable, loop, "--rounds", "3", "--steps", "6", "--seed", "2"],
        capture_output=True, text=True, timeout=900, env=crashlib.env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "losses bit for bit" in out.stdout.splitlines()[-1]
