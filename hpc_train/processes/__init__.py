"""A rank's process from outside: the variables a launcher gives it, a script job's command line, the /proc table (both
sides; no torch, no Hydra)."""
