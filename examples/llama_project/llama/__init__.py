"""llama: a researcher's own Llama-style decoder, its character data and its loss.

Nothing here imports hpc_train: the config in ../conf names these with _target_.
"""

from llama.data import CHARS, VOCAB_SIZE, CharWindows, make_log
from llama.loss import next_token_loss
from llama.model import Transformer

__all__ = ["CHARS", "VOCAB_SIZE", "CharWindows", "Transformer", "make_log", "next_token_loss"]
