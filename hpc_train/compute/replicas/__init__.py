"""Replica groups that survive a failure (``fault_tolerance.replica_groups``): the job's data parallelism split into
groups that form a quorum at every step through torchft's lighthouse, average their gradients over the live groups
only, and bring a restarted group back from a live peer's memory instead of from disk."""
