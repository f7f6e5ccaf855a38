"""What a run's training is made of, below the backends and callbacks that use it: the optimizer
and its learning-rate schedule (`optimizers`) and how long the run is (`steps`)."""
