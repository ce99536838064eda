"""The training loop and its parts: the step, optimizer and schedule, precision, gradients, EMA, activation
checkpointing, and where rank 0's metrics go (loggers and trackers)."""
