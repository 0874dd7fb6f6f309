#!/usr/bin/env python
"""Write a checkpoint as a Hugging Face directory that `transformers` loads.

    python scripts/export_hf.py CHECKPOINT_DIR OUT_DIR [--step N]

Then: `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`. See docs/huggingface.md.
"""

import sys

from colossal_jax.hf_export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
