"""tinygpt: a small character-level GPT in nanoGPT's shape, with its own generated text.

Nothing here imports hpc_train except the stream datasets, which ask it for their data shard;
the config in ../conf names these classes with _target_.
"""

from tinygpt.data import ALPHABET, VOCAB_SIZE, CharDataset, CharStream, CharStreamNoState, make_text
from tinygpt.model import GPT, GPTConfig

__all__ = ["ALPHABET", "GPT", "GPTConfig", "VOCAB_SIZE", "CharDataset", "CharStream", "CharStreamNoState", "make_text"]
