"""A rank's life: who it is (ranks), its process group and device, starting (entry, job, script jobs), stop signals
and requeue, the heartbeat and hang watchdog, per-rank logs and the attempt log."""
