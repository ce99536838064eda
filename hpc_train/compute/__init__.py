"""Compute side: everything that runs inside a training process (imports torch)."""
