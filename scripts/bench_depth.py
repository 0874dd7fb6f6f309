"""Step time of the library's training step at several depths, interleaved in one process.

``python scripts/bench_depth.py [train flags] --layers 2,8 [--baseline plain-jax] [--json PATH]``
(``benchmarks/depth.py``): per depth the wall and CPU time per step, and the median of the
paired ratios t(L) / t(first depth).
"""

import sys

from colossal_jax_benchmarks.depth import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
