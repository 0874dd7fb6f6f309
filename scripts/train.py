#!/usr/bin/env python
"""Train a GPT: `python scripts/train.py --help` lists the flags.

Examples:
  python scripts/train.py                                   # gpt2-tiny, 8 simulated CPU devices
  python scripts/train.py --mesh data=2,tensor=4 --tensor-mode 1d
  python scripts/train.py --checkpoint-dir /tmp/run1        # re-run the same command to resume
"""


from colossal_jax.runtime import signals  # noqa: E402  (first: Ctrl-C from here on stops cleanly)

signals.install()

from colossal_jax.cli import run  # noqa: E402  (imports no JAX: --devices sets XLA_FLAGS first)

if __name__ == "__main__":
    run()
