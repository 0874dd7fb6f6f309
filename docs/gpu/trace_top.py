"""Top events of a jax.profiler perfetto trace by total duration, and its attention kernels."""

import collections
import glob
import gzip
import json
import re
import sys

path = sorted(glob.glob(sys.argv[1] + "/plugins/profile/*/perfetto_trace.json.gz"))[-1]
with gzip.open(path) as f:
    data = json.load(f)
events = data["traceEvents"] if isinstance(data, dict) else data
procs = {
    e["pid"]: e.get("args", {}).get("name", "")
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name"
}
tot: collections.Counter = collections.Counter()
cnt: collections.Counter = collections.Counter()
for e in events:
    if e.get("ph") != "X":
        continue
    p = procs.get(e.get("pid"), "")
    key = (p[:40], e.get("name", "")[:150])
    tot[key] += e.get("dur", 0)
    cnt[key] += 1
print("trace:", path)
print("processes:", sorted(set(procs.values()))[:20])
print("top 30 by total us:")
for (p, n), d in tot.most_common(30):
    print(f"{d:12.0f} us  x{cnt[(p, n)]:5d}  [{p}] {n}")
print("top 40 GPU events by total us:")
gpu = [(k, d) for k, d in tot.items() if "GPU" in k[0]]
step_us = sum(d for _, d in gpu)
print(f"GPU busy total {step_us:.0f} us over the traced steps")
for (p, n), d in sorted(gpu, key=lambda kv: -kv[1])[:40]:
    print(f"{d:12.0f} us  x{cnt[(p, n)]:5d}  {n}")
pat = re.compile(r"cudnn|fmha|flash|sdpa|attention", re.I)
print("attention-like events:")
for (p, n), d in sorted(tot.items(), key=lambda kv: -kv[1]):
    if pat.search(n):
        print(f"{d:12.0f} us  x{cnt[(p, n)]:5d}  [{p}] {n}")
