"""Where a rank's time and memory go: the FLOPs of a step and the device's peak (MFU), peak memory, the step's
phases, and profiler traces on request (``trainer.profile``)."""
