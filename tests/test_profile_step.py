"""scripts/profile_step.py and colossal_jax/auto/profile.py: a plan's traced step by kind of
operation."""

from __future__ import annotations

import json

import pytest

from colossal_jax.auto import profile
from tests.test_planner import _script

TINY = ["--set", "n_layer=2", "--set", "n_embd=64", "--batch-size", "8", "--seq-len", "32"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ThunkExecutor::Execute", None),
        ("Rendezvous", None),
        ("while.116", None),
        ("$measure.py:116 time", None),
        ("ynn_fusion.38", "matmul"),
        ("dot.42", "matmul"),
        ("all-reduce.1", "collective"),
        ("psum_invariant.162", "collective"),
        ("all-to-all.24", "collective"),
        ("bitcast_dynamic-update-slice_fusion.2", "dynamic-update-slice"),
        ("maximum_dynamic-slice_fusion.17", "dynamic-slice"),
        ("wrapped_broadcast.5", "broadcast"),
        ("copy.993", "copy"),
        ("transpose_copy_fusion.27", "copy"),
        ("multiply_add_fusion", "other"),
    ],
)
def test_trace_events_are_put_in_their_kind(name, kind):
    assert profile.kind_of(name) == kind


def test_a_data_parallel_step_traced_by_kind(tmp_path):
    out = tmp_path / "profile.json"
    argv = ["--devices", "8", *TINY, "--plan", "^data=8 zero=0 remat=none$", "--steps", "2"]
    assert _script("profile_step").main([*argv, "--top", "5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["plan"] == "data=8 zero=0 remat=none"
    assert set(doc["by_kind"]) == set(profile.KINDS)
    assert doc["by_kind"]["matmul"] > 0  # the layers' matmuls on every device
    assert doc["by_kind"]["collective"] > 0  # the gradient's all-reduce over data
    assert doc["step_s"] > 0
    assert len(doc["top"]) == 5
    assert all(kind in profile.KINDS for _, kind, _, _ in doc["top"])
    seconds = [s for _, _, s, _ in doc["top"]]
    assert seconds == sorted(seconds, reverse=True)


def test_a_plan_no_name_matches_ends_in_one_line(capsys):
    argv = ["--devices", "8", *TINY, "--plan", "^no-such-plan$"]
    assert _script("profile_step").main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plan '^no-such-plan$' matches none" in err[0]
    assert _script("profile_step").main([*argv[:-1], "(("]) == 2
    assert "is not a regular expression" in capsys.readouterr().err
