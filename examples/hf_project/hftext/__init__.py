"""hftext: data for a Hugging Face causal LM trained with hpc_train; the model is transformers' own.

Nothing here imports hpc_train or transformers: ../conf names transformers.GPT2LMHeadModel and
hftext.TextBlocks with _target_, and hpc_train's shipped step calls model(**batch).loss.
"""

from hftext.data import TextBlocks, make_text

__all__ = ["TextBlocks", "make_text"]
