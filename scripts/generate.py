#!/usr/bin/env python
"""Sample text from a checkpoint: `python scripts/generate.py --help` lists the flags.

    python scripts/generate.py --checkpoint-dir /tmp/run1 --prompt "def " --max-new-tokens 200
    python scripts/generate.py --checkpoint-dir /tmp/run1 --prompt "import " --devices 4 \
        --mesh tensor=4 --tensor-mode 2d --top-k 20 --seed 1
"""

import sys

from colossal_jax.generate import main  # noqa: E402  (imports no JAX: --devices comes first)

if __name__ == "__main__":
    sys.exit(main())
