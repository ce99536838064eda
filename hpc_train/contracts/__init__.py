"""The tables both sides read beside the config's declarations: strategies, mesh dimensions, trackers, checkpoint
fingerprints (no torch, no Hydra)."""
