"""Cluster detection, scripts/launch_local.py and a lost peer (tests/test_multiprocess.py runs
the plain two-process case)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from colossal_jax.checks.preflight import detect_cluster
from colossal_jax.config import ConfigError
from colossal_jax.runtime.watchdog import Beats, lost_line
from tests.helpers import script_env

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "scripts" / "train.py")
LAUNCH = str(ROOT / "scripts" / "launch_local.py")
SMALL = [
    "--batch-size", "8", "--seq-len", "32", "--set", "model.n_layer=1",
    "--set", "model.n_embd=64", "--no-progress", "--eval-every", "0",
]  # fmt: skip

SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NODELIST": "node[001-004]",
}
OMPI = {
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
}
K8S = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "3"}


def test_detect_cluster_from_environments():
    assert detect_cluster({}) is None
    assert detect_cluster({"PATH": "/bin"}) is None
    assert detect_cluster(SLURM) == "SLURM job 4242, rank 2 of 4"
    assert detect_cluster(OMPI) == "Open MPI, rank 1 of 2"
    assert detect_cluster(K8S, kubernetes_installed=True) == (
        "Kubernetes Indexed Job, completion index 3"
    )
    # one task is not a cluster (an interactive salloc shell, a single-rank mpirun)
    assert detect_cluster({**SLURM, "SLURM_NTASKS": "1"}) is None
    assert detect_cluster({"SLURM_JOB_ID": "1"}) is None
    assert detect_cluster({**OMPI, "OMPI_COMM_WORLD_SIZE": "1"}) is None
    # a pod that is not part of an Indexed Job
    assert detect_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None


def test_explicit_flags_and_opt_out_win():
    assert detect_cluster(SLURM, coordinator="10.0.0.1:1234") is None
    assert detect_cluster(SLURM, opt_out=True) is None
    assert detect_cluster({**OMPI, "COLOSSAL_NO_CLUSTER_DETECT": "1"}) is None
    assert detect_cluster({**OMPI, "COLOSSAL_NO_CLUSTER_DETECT": "0"}) is not None


def test_incomplete_clusters_are_config_errors():
    bad_slurm = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    with pytest.raises(ConfigError, match="srun"):
        detect_cluster(bad_slurm)
    with pytest.raises(ConfigError, match="OMPI_MCA_orte_hnp_uri"):
        detect_cluster({k: v for k, v in OMPI.items() if k != "OMPI_MCA_orte_hnp_uri"})
    with pytest.raises(ConfigError, match=r"jax\[k8s\]"):
        detect_cluster(K8S, kubernetes_installed=False)


def test_cli_reports_an_incomplete_cluster_in_one_line(capsys):
    from colossal_jax.cli import main

    env = {k: v for k, v in SLURM.items() if k != "SLURM_PROCID"}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        assert main(["--steps", "1"]) == 2
    finally:
        os.environ.clear()
        os.environ.update(old)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: SLURM job 4242"), err


@pytest.mark.parametrize("value", ["0", "4", "-1", "1e9"])
def test_peer_timeout_is_validated(capsys, value):
    from colossal_jax.cli import main

    assert main(["--peer-timeout", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --peer-timeout "), err


class FakeStore:
    """The key-value calls of a coordination-service client, with processes that stop."""

    def __init__(self):
        self.kv: dict[str, str] = {}
        self.down = False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        self.kv[key] = value

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def test_beats_name_the_silent_process():
    now = [0.0]
    store = FakeStore()
    procs = [Beats(store, i, 3, clock=lambda: now[0]) for i in range(3)]
    for _ in range(3):
        now[0] += 1
        for b in procs:
            b.beat()
    for _ in range(6):  # process 1 died
        now[0] += 1
        procs[0].beat()
        procs[2].beat()
    assert procs[0].lost(silent_for=5) == [1]
    assert procs[2].lost(silent_for=5) == [1]
    store.down = True  # process 0, which hosts the store, died
    for _ in range(6):
        now[0] += 1
        with pytest.raises(RuntimeError):
            procs[2].beat()
    assert procs[2].lost(silent_for=5) == [0]
    assert lost_line([1], 20, "step 3") == (
        "error: lost contact with process 1 (step 3 unfinished after 20s); exiting"
    )
    assert lost_line([1, 2], 20.5, "step 3").startswith("error: lost contact with processes 1, 2")


def _losses(path: Path) -> list[float]:
    return [r["loss"] for x in path.read_text().splitlines() if "loss" in (r := json.loads(x))]


def test_launch_local_rejects_its_own_mistakes():
    for argv, word in (
        (["--processes", "0"], "--processes 0"),
        (["--processes", "2", "--", "--process-id", "1"], "--process-id is set by the launcher"),
        (["--devices-per-process", "2"], "--processes"),
    ):
        out = subprocess.run(
            [sys.executable, LAUNCH, *argv], capture_output=True, text=True, env=script_env()
        )
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and word in lines[0], lines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_lost_peer_ends_the_survivor_with_one_line(tmp_path):
    """SIGKILL process 1 after its first step: process 0 exits (status 4) within --peer-timeout
    10 with one line naming process 1, and no process is left."""
    from tests.test_multiprocess import _free_port

    metrics = tmp_path / "m.jsonl"
    port = _free_port()
    common = [TRAIN, "--steps", "1000", "--mesh", "data=4", "--devices", "2", *SMALL]
    # 10 s (5 is the least accepted): a step here takes well under a second, and JAX's own
    # heartbeat (3 × 10 s) still comes after the watchdog's line
    common += ["--peer-timeout", "10", "--coordinator", f"127.0.0.1:{port}"]
    common += ["--num-processes", "2"]
    procs = [
        subprocess.Popen(
            [sys.executable, *common, "--process-id", str(i)]
            + (["--metrics-file", str(metrics)] if i == 0 else []),
            env=script_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 240
        while not (metrics.exists() and '"loss"' in metrics.read_text()):
            assert time.monotonic() < deadline, "no step within 240 s"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[0].communicate(timeout=60)
        took = time.monotonic() - killed
        assert procs[0].returncode == 4, err
        assert took < 10 + 5, took
        errors = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(errors) == 1, err
        assert errors[0].startswith("error: lost contact with process 1 ("), errors
        assert errors[0].endswith("; exiting"), errors
        procs[1].wait(timeout=10)
        assert not any(_alive(p.pid) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _launch(processes: int, per: int, ckpt: Path, metrics: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, LAUNCH, "--processes", str(processes), "--devices-per-process",
         str(per), "--", "--steps", "14", *SMALL, "--checkpoint-dir", str(ckpt),
         "--checkpoint-every", "10", "--metrics-file", str(metrics)],
        env=script_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout.splitlines()


@pytest.mark.slow
def test_launch_local_trains_like_one_process_and_resumes_elsewhere(tmp_path):
    """2 processes × 4 devices train 14 steps with the losses of 1 process × 8 devices and
    write one checkpoint of steps 10 and 14; from the one of step 10 (as if the run had died
    after it), 2 × 4 and 4 × 2 processes continue to step 14 with the losses of 1 × 8.

    The 1 × 8 run is uninterrupted (a single-process resume continues its losses bit for bit:
    tests/test_signals.py, the kill loop), so it is the reference of both phases: one run less
    than a 10-step reference and a 1 × 8 resume of its own, with the same 14-step schedule."""
    import shutil

    ckpt = tmp_path / "ckpt"
    lines = _launch(2, 4, ckpt, tmp_path / "a.jsonl")
    assert any(x.startswith("[0] ") for x in lines) and all(
        x.startswith(("[0] ", "[1] ")) for x in lines
    ), lines
    metrics = tmp_path / "one.jsonl"
    subprocess.run(
        [sys.executable, TRAIN, "--devices", "8", "--steps", "14", *SMALL,
         "--metrics-file", str(metrics)],
        check=True, env=script_env(), capture_output=True, timeout=300,
    )  # fmt: skip
    one = _losses(metrics)
    assert len(one) == 14
    np.testing.assert_allclose(_losses(tmp_path / "a.jsonl"), one, rtol=1e-5)
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["10", "14"]
    shutil.rmtree(ckpt / "14")
    four = tmp_path / "four"
    shutil.copytree(ckpt, four)
    for processes, per, where, name in ((2, 4, ckpt, "b"), (4, 2, four, "c")):
        lines = _launch(processes, per, where, tmp_path / f"{name}.jsonl")
        assert any("resumed from" in x and "at step 10" in x for x in lines), lines
        np.testing.assert_allclose(_losses(tmp_path / f"{name}.jsonl"), one[10:], rtol=1e-5)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path):
    """A scheduler may signal one process of a job: the steps carry every process's stop flag
    (``train.stop_flags``), so both processes stop after the same step, save one checkpoint of
    it together and exit 143 with one line, within 30 s."""
    from colossal_jax.training.checkpoint import Checkpointer
    from tests.test_multiprocess import _free_port

    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ck"
    port = _free_port()
    common = [TRAIN, "--steps", "1000", "--mesh", "data=4", "--devices", "2", *SMALL]
    common += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    common += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1000"]
    procs = [
        subprocess.Popen(
            [sys.executable, *common, "--process-id", str(i)]
            + (["--metrics-file", str(metrics)] if i == 0 else []),
            env=script_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 240
        while not metrics.exists() or len(_losses(metrics)) < 3:
            assert time.monotonic() < deadline, "no step within 240 s"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGTERM)
        sent = time.monotonic()
        outs = [p.communicate(timeout=60) for p in procs]
        assert time.monotonic() - sent < 30
        lines = []
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 143, err
            assert "Traceback" not in err, err
            lines.append(err.strip().splitlines()[-1])
        steps = [int(x.split(" at step ")[1].split(";")[0]) for x in lines]
        assert steps[0] == steps[1] >= 3, lines
        assert lines[1].startswith("interrupted by SIGTERM at step"), lines
        assert lines[0].startswith("interrupted by SIGTERM (received by another process)"), lines
        assert "checkpoint saved in" in lines[0] and "checkpoint saved in" in lines[1], lines
        assert Checkpointer(str(ckpt), 1000, read_only=True).latest_step() == steps[0]
        assert len(_losses(metrics)) == steps[0]  # process 0 logged every step it ran
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
