"""A rank's entry points: what worker.py and submitit call, above the layers they use."""
