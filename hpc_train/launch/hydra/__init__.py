"""The launch side's Hydra wing: the hpc-train sweep launcher, the Hydra app launchers, Hydra's errors and
internals, the API's child process."""
