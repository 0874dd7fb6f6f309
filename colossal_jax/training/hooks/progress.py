"""The progress bar (tqdm): one tick a step, with the loss and tokens/s, and the held-out loss
(and accuracy) after an evaluation."""

from __future__ import annotations

from typing import Any

from colossal_jax.training.loop import Hook, Loop


class ProgressBar(Hook):
    """A bar from the start step to the last, created when the loop starts."""

    def __init__(self) -> None:
        self.bar: Any = None

    def start(self, loop: Loop) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=loop.last_step,
            initial=loop.start_step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )

    def result(self, loop: Loop, record: dict[str, Any], outputs: dict[str, Any]) -> None:
        post = {"loss": f"{record['loss']:.4f}", "tok_s": f"{record['tokens_per_s']:,.0f}"}
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def state(self, loop: Loop, record: dict[str, Any]) -> None:
        if "eval_loss" not in record:
            return
        post = {"loss": f"{record['loss']:.4f}", "eval": f"{record['eval_loss']:.4f}"}
        if "eval_accuracy" in record:
            post["acc"] = f"{100 * record['eval_accuracy']:.1f}%"
        self.bar.set_postfix(post, refresh=False)

    def close(self, loop: Loop) -> None:
        if self.bar is not None:
            self.bar.close()
