"""The concerns of the training loop, one :class:`~colossal_jax.training.loop.Hook` a module:
metrics files and TensorBoard (:mod:`.metrics`), the progress bar (:mod:`.progress`),
evaluation (:mod:`.evaluation`), checkpoints (:mod:`.checkpoint`), the stop on a signal agreed by
every process (:mod:`.stop`), the divergence guard (:mod:`.divergence`), the peer watchdog
(:mod:`.watchdog`) and the profiler (:mod:`.profiler`). :func:`colossal_jax.training.trainer.train`
picks those a run asks for and their order."""
