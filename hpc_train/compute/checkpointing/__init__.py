"""Saving and restoring a run: the checkpointer (what a resumed run needs), the file format of whole-model
checkpoints, sharded (DCP) checkpoints and their checkpointer."""
