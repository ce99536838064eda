"""From a laptop: the project synced to a cluster over SSH, its `hpc-train` run there by the cluster's own hpc_train,
and the run dirs' records mirrored back for reports (login side; never imports torch)."""
