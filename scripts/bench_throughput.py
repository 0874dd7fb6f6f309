"""Throughput of the library's training step against plain JAX (or PyTorch) doing the same work.

``python scripts/bench_throughput.py [train flags] --json PATH [--baseline plain-jax|torch|none]``
takes every flag of ``scripts/train.py`` (the configuration to measure) and appends one JSON
record to PATH: step times (min, median) of both sides measured interleaved in one process, the
median of paired ratios, tokens/s, model TFLOP/s per device, MFU, peak memory, compile times,
and the training loop's time outside the compiled step (``benchmarks/throughput.py``).
"""

import sys

from colossal_jax_benchmarks.throughput import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
