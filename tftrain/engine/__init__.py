"""The training engine: one run of `tftrain train` (`engine.train`), and the pieces it is told
with: optimizers and schedules, gradient accumulation, precision, determinism, export,
evaluation, HParams."""
