"""Where commands run: on this machine, or on a cluster's login node over one multiplexed SSH connection."""
