"""The training loop: one trainer for any algorithm (``trainer``), the run directory (``run``,
``run_lock``, ``run_policy``: checkpoints and the policy artifact beside them), evaluation
(``evaluate``) and seed/grid sweeps (``sweep``)."""
