#!/bin/bash
# deploy/slurm.sbatch under real SLURM daemons (deploy/slurm/local-cluster.sh): brings the
# one-node cluster up and runs the recipe, unchanged but for sbatch's own resource flags and a
# tiny model, through six scenarios, each against one process of 8 CPU devices:
#
#   2 tasks        2 tasks x 4 devices, jax.distributed from SLURM's environment alone (1e-5)
#   preempt        scancel --signal=TERM mid-run: both tasks save one agreed step and exit 143;
#                  scontrol requeue resumes from it (1e-5)
#   time limit     the recipe's own warning (--signal=TERM@120) once the time limit is cut to
#                  under 2 min: save, the script requeues itself, resume (1e-5)
#   resize         preempt's checkpoint resubmitted as 1 task x 4 devices: data=4 with 2
#                  accumulation steps, the same global batch (1e-4)
#   lost task      SIGKILL to one task's process: the job ends within --peer-timeout + 10 s
#                  with a line naming the task; scontrol requeue resumes from the last
#                  complete checkpoint (1e-5)
#   hung task      SIGSTOP to one task's process (SLURM sees nothing): the other's watchdog
#                  ends the job within --peer-timeout + 10 s with a line naming the task
#
# One line per scenario with its figure (largest relative loss difference, wall time); exit
# status 1 if any fails. CHECK_DIR (default a new /tmp/colossal-slurm-check.*) keeps the runs
# and logs. Needs the local cluster's packages or root to install them (local-cluster.sh up).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${CHECK_DIR:-$(mktemp -d /tmp/colossal-slurm-check.XXXXXX)}
mkdir -p "$WORK"
PEER_TIMEOUT=20
SHORT=100 # steps of every scenario but the time limit's
# slurmctld checks time limits every 30 s: the time limit's run must outlast that (raise
# CHECK_LONG_STEPS on a fast machine)
LONG=${CHECK_LONG_STEPS:-250}
TINY=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=64 --seq-len 32
  --batch-size 16 --device-batch 2 --precision fp32 --checkpoint-every 10
  --peer-timeout "$PEER_TIMEOUT")
FAILED=0
export SLURM_CONF=${SLURM_CONF:-${COLOSSAL_SLURM_DIR:-/tmp/colossal-slurm}/slurm.conf}

"$ROOT/deploy/slurm/local-cluster.sh" up || exit 1
cd "$ROOT" || exit 1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if ! python -c "import colossal_jax_models, colossal_jax_meshes" 2>/dev/null; then
  # an editable install of another checkout (or none): this checkout's models/ and meshes/
  mkdir -p "$WORK/packages"
  ln -sfn "$ROOT/models" "$WORK/packages/colossal_jax_models"
  ln -sfn "$ROOT/meshes" "$WORK/packages/colossal_jax_meshes"
  export PYTHONPATH=$PYTHONPATH:$WORK/packages
fi
unset XLA_FLAGS

say() { echo "check: $*"; }
result() { # scenario ok|FAILED text
  printf 'check: %-11s %-6s %s\n' "$1" "$2" "$3"
  [[ $2 == ok ]] || FAILED=1
}

# the largest relative loss difference of metrics file $2 from $1, step by step (as
# scripts/compare_losses.py measures it), or a line why not
maxdiff() {
  python - "$1" "$2" <<'PY'
import json, sys
def load(p):
    out = {}
    for line in open(p):
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if sorted(a) != sorted(b):
    print(f"steps differ: {len(b)} steps (1..{max(b, default=0)}) for {len(a)}")
else:
    print(f"{max(abs(a[s] - b[s]) / abs(a[s]) for s in a):.2e}")
PY
}

# ok when figure $1 is a number no larger than $2
within() { python -c "import sys; sys.exit(0 if float('$1') <= $2 else 1)" 2>/dev/null; }

# submit the recipe: run dir $1, then sbatch flags; prints the job id
submit() {
  local run=$1
  shift
  mkdir -p "$run"
  RUN_DIR=$run COLOSSAL_CPU_DEVICES=${DEVICES:-4} COLOSSAL_REQUEUE=${REQUEUE:-1} \
    sbatch --parsable --job-name=check --nodes=1 --ntasks-per-node="${TASKS:-2}" \
    --cpus-per-task=1 --output="$run/job.out" "$@" deploy/slurm.sbatch "${TINY[@]}" \
    --steps "${STEPS:-$SHORT}"
}

state() { scontrol show job "$1" 2>/dev/null | grep -o -E 'JobState=[A-Z_]+' | cut -d= -f2; }
restarts() { scontrol show job "$1" 2>/dev/null | grep -o -E 'Restarts=[0-9]+' | cut -d= -f2; }

# wait (at most $2 s) until job $1 has ended: COMPLETED, FAILED, CANCELLED, TIMEOUT...
wait_end() {
  local end=$((SECONDS + $2)) s
  while ((SECONDS < end)); do
    s=$(state "$1")
    case $s in PENDING | RUNNING | CONFIGURING | COMPLETING | REQUEUED | SUSPENDED) ;; *)
      echo "$s"
      return 0
      ;;
    esac
    sleep 1
  done
  echo "still $(state "$1") after $2 s"
  return 1
}

# wait (at most $3 s) until metrics file $1 has a record of step >= $2
wait_step() {
  local end=$((SECONDS + $3))
  while ((SECONDS < end)); do
    if [[ -f $1 ]] && (($(grep -c '"loss"' "$1") >= $2)); then return 0; fi
    sleep 0.2
  done
  return 1
}

# the step that the "interrupted by SIGTERM at step N" lines of job output $1 agree on, or
# nothing when they do not (both tasks must have saved it)
agreed_step() {
  grep -o -E 'interrupted by SIGTERM( \(received by another process\))? at step [0-9]+; checkpoint saved' "$1" \
    | grep -o -E 'step [0-9]+' | sort | uniq -c | awk '$1 == 2 {print $3}' | tail -1
}

requeue_and_wait() { # job, seconds; prints the final state
  scontrol requeue "$1" || return 1
  wait_end "$1" "$2"
}

# ---- the reference: one process of 8 CPU devices, SHORT and LONG steps
start=$SECONDS
for steps in "$SHORT" "$LONG"; do
  JAX_PLATFORMS=cpu python scripts/train.py --devices 8 "${TINY[@]}" --steps "$steps" \
    --no-progress --metrics-file "$WORK/ref-$steps.jsonl" >"$WORK/ref-$steps.log" 2>&1 \
    || { say "the reference run failed: $WORK/ref-$steps.log"; tail -5 "$WORK/ref-$steps.log"; exit 1; }
done
say "reference: 1 process x 8 devices, $SHORT and $LONG steps ($((SECONDS - start)) s)"

# ---- 2 tasks x 4 devices
start=$SECONDS
run=$WORK/two
job=$(submit "$run")
s=$(wait_end "$job" 600)
d=$(maxdiff "$WORK/ref-$SHORT.jsonl" "$run/metrics.jsonl" 2>&1)
if [[ $s == COMPLETED ]] && grep -q "cluster: SLURM job $job, rank 1 of 2" "$run/job.out" \
  && within "$d" 1e-5; then
  result "2 tasks" ok "max rel. loss diff $d vs 1x8 devices, $SHORT steps; $((SECONDS - start)) s"
else
  result "2 tasks" FAILED "job $job $s; loss diff $d; see $run/job.out"
fi

# ---- preempt: scancel --signal=TERM, then scontrol requeue
start=$SECONDS
run=$WORK/preempt
job=$(REQUEUE=0 submit "$run")
ok=1 why=""
if wait_step "$run/metrics.jsonl" 10 300; then
  scancel --signal=TERM "$job"
  s=$(wait_end "$job" 120)
  at=$(agreed_step "$run/job.out")
  if [[ -z $at ]] || ! grep -q "ExitCode=143:0" <(scontrol show job "$job"); then
    ok=0 why="job $s, no agreed SIGTERM step saved by both tasks (exit status 143)"
  fi
  cp -r "$run" "$WORK/resize"  # the checkpoint that the resize scenario resumes from
  s=$(requeue_and_wait "$job" 600)
  if ((ok)) && ! grep -q "resumed from $run/ckpt at step $at" "$run/job.out"; then
    ok=0 why="the requeued job ($s) did not resume from step $at"
  fi
else
  ok=0 why="no step 10 within 300 s"
fi
d=$(maxdiff "$WORK/ref-$SHORT.jsonl" "$run/metrics.jsonl" 2>&1)
if ((ok)) && [[ $s == COMPLETED ]] && within "$d" 1e-5; then
  result preempt ok "max rel. loss diff $d across a SIGTERM at step $at + requeue; $((SECONDS - start)) s"
else
  result preempt FAILED "${why:-job $s, loss diff $d}; see $run/job.out"
fi

# ---- time limit: the recipe's warning signal, then its own requeue
start=$SECONDS
run=$WORK/timelimit
job=$(STEPS=$LONG submit "$run" --time=10)
ok=1 why=""
if wait_step "$run/metrics.jsonl" 1 300; then
  # cut the limit to under 2 min from now: the --signal=TERM@120 warning is due at once
  elapsed=$(scontrol show job "$job" | grep -o -E 'RunTime=[0-9:-]+' | cut -d= -f2)
  IFS=: read -r h m sec <<<"$elapsed"
  limit=$(((10#$h * 3600 + 10#$m * 60 + 10#$sec) / 60 + 2))
  scontrol update JobId="$job" TimeLimit="$limit"
  end=$((SECONDS + 240))
  while [[ $(restarts "$job") == 0 && $(state "$job") == RUNNING ]] && ((SECONDS < end)); do
    sleep 1
  done
  # the requeued job gets its 10 minutes back (else the warning would come at its start)
  scontrol update JobId="$job" TimeLimit=10
  at=$(agreed_step "$run/job.out")
  [[ -n $at ]] || { ok=0; why="no agreed SIGTERM step saved by both tasks (did the run end \
before the warning? raise CHECK_LONG_STEPS)"; }
  grep -q "requeueing job $job" "$run/job.out" || { ok=0; why="the job did not requeue itself"; }
  s=$(wait_end "$job" 600)
  if ((ok)) && ! grep -q "resumed from $run/ckpt at step $at" "$run/job.out"; then
    ok=0 why="the requeued job ($s) did not resume from step $at"
  fi
else
  ok=0 why="no step within 300 s"
fi
d=$(maxdiff "$WORK/ref-$LONG.jsonl" "$run/metrics.jsonl" 2>&1)
if ((ok)) && [[ $s == COMPLETED ]] && within "$d" 1e-5; then
  result "time limit" ok "max rel. loss diff $d across the warning at step $at + self-requeue; $((SECONDS - start)) s"
else
  result "time limit" FAILED "${why:-job $s, loss diff $d}; see $run/job.out"
fi

# ---- resize: preempt's checkpoint on 1 task x 4 devices (data=4, 2 accumulation steps)
start=$SECONDS
run=$WORK/resize
if [[ -d $run/ckpt ]]; then
  : >"$run/job.out"
  job=$(TASKS=1 submit "$run")
  s=$(wait_end "$job" 600)
  d=$(maxdiff "$WORK/ref-$SHORT.jsonl" "$run/metrics.jsonl" 2>&1)
  if [[ $s == COMPLETED ]] && grep -q "resumed from" "$run/job.out" && within "$d" 1e-4; then
    result resize ok "max rel. loss diff $d, 2x4 devices -> 1x4 (accumulation 2); $((SECONDS - start)) s"
  else
    result resize FAILED "job $s, loss diff $d; see $run/job.out"
  fi
else
  result resize FAILED "no checkpoint from the preempt scenario"
fi

# ---- lost task: SIGKILL to task 1's process
start=$SECONDS
run=$WORK/lost
job=$(REQUEUE=0 submit "$run")
ok=1 why=""
if wait_step "$run/metrics.jsonl" 25 300; then
  pid=$(scontrol listpids "$job" | awk '$5 == 1 && $3 == 0 {print $1}' | head -1)
  last=$(find "$run/ckpt" -maxdepth 1 -regex '.*/[0-9]+' -printf '%f\n' | sort -n | tail -1)
  killed=$SECONDS
  kill -KILL "$pid"
  s=$(wait_end "$job" $((PEER_TIMEOUT + 60)))
  took=$((SECONDS - killed))
  line=$(grep -E 'task 1|process 1' "$run/job.out" | grep -v Gloo | head -1)
  if ((took > PEER_TIMEOUT + 10)) || [[ -z $line ]]; then
    ok=0 why="job $s after ${took} s; line naming task 1: ${line:-none}"
  fi
  s=$(requeue_and_wait "$job" 600)
  resumed=$(grep -o -E "resumed from $run/ckpt at step [0-9]+" "$run/job.out" | tail -1)
  if ((ok)) && ((${resumed##* } < last)); then
    ok=0 why="resumed at ${resumed##* }, the last checkpoint before the kill was $last"
  fi
else
  ok=0 why="no step 25 within 300 s"
fi
d=$(maxdiff "$WORK/ref-$SHORT.jsonl" "$run/metrics.jsonl" 2>&1)
if ((ok)) && [[ $s == COMPLETED ]] && within "$d" 1e-5; then
  result "lost task" ok "ended ${took} s after the kill ('$line'); resumed at step ${resumed##* }, max rel. loss diff $d; $((SECONDS - start)) s"
else
  result "lost task" FAILED "${why:-job $s, loss diff $d}; see $run/job.out"
fi

# ---- hung task: SIGSTOP to task 1's process; SLURM sees nothing, the peer watchdog does
start=$SECONDS
run=$WORK/hung
job=$(REQUEUE=0 submit "$run")
ok=1 why=""
if wait_step "$run/metrics.jsonl" 10 300; then
  pid=$(scontrol listpids "$job" | awk '$5 == 1 && $3 == 0 {print $1}' | head -1)
  stopped=$SECONDS
  kill -STOP "$pid"
  s=$(wait_end "$job" $((PEER_TIMEOUT + 60)))
  took=$((SECONDS - stopped))
  line=$(grep -E '^error: lost contact with process 1 ' "$run/job.out" | head -1)
  if ((took > PEER_TIMEOUT + 10)) || [[ -z $line ]]; then
    ok=0 why="job $s after ${took} s; watchdog line: ${line:-none}"
  fi
else
  ok=0 why="no step 10 within 300 s"
fi
if ((ok)); then
  result "hung task" ok "ended ${took} s after SIGSTOP (--peer-timeout $PEER_TIMEOUT): '$line'"
else
  result "hung task" FAILED "$why; see $run/job.out"
fi

say "runs and logs in $WORK"
exit "$FAILED"
