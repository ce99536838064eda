"""The training set's epochs as the loop reads them: an epoch's batches from the loop's position, how many
optimizer steps an epoch has, and whether the loop has finished one.

A map-style dataset's epoch is its sampler's permutation (data/loaders.py), started part-way at
the exact next batch after a resume; it ends at its length. A stream (a
``torch.utils.data.IterableDataset``, which shards itself) is re-read from its start every epoch:

* without a length, its epoch ends when it runs out; the run's length is ``trainer.max_steps``;
* with one, at the length of the shortest rank's share (the ranks agree on it once);
* either way, a rank whose share runs out first ends the epoch on every rank (the ranks agree
  before every step, one collective), instead of leaving the others waiting in a collective;
* read through torchdata's StatefulDataLoader (a stream with ``state_dict()``), its position is
  checkpointed per rank (:attr:`TrainEpochs.loader`) and a resume continues exactly; any other
  stream, or a resume at another number of ranks, re-reads the epoch from its start and drops
  the batches already trained on.

Usage, one epoch: ``epoch = epochs.open(index, step_in_epoch)``, then ``for batch in epoch``
(each batch one optimizer step; the loop may stop early), then ``epoch.ended(step_in_epoch)``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Optional

from hpc_train.compute.data.loaders import (
    DataSettings,
    has_length,
    is_stateful,
    is_stream,
    stream_loader,
    train_loader,
)
from hpc_train.compute.runtime import distributed
from hpc_train.compute.runtime.refusal import Refusal

log = logging.getLogger("hpc_train")
_END = object()  # a stream's iterator ran out


class Epoch:
    """One epoch's batches from the loop's position. Iterated once; each batch it yields is one optimizer step."""

    def __init__(self, epochs: "TrainEpochs", index: int, batches: Iterator[Any]) -> None:
        self.epochs, self.index, self._batches = epochs, index, batches
        self.ran_out = False  # every batch was read (the loop did not stop inside the epoch)

    def __iter__(self) -> Iterator[Any]:
        yield from self._batches
        self.ran_out = True

    def ended(self, step_in_epoch: int) -> bool:
        """Whether the loop, `step_in_epoch` optimizer steps into this epoch, has finished it. A stream without a
        length ends its epoch only by running out: one that yields no batch at all is refused."""
        epochs = self.epochs
        if epochs.steps_per_epoch is not None:
            return step_in_epoch >= epochs.steps_per_epoch or (epochs.stream and self.ran_out)
        if self.ran_out and step_in_epoch == 0:
            raise Refusal(
                f"`data.train`: the stream ({type(epochs.dataset).__name__}) yielded no batch of"
                f" {epochs.per_rank_batch} items in epoch {self.index} on some rank. Fix: check its sharding"
                " (hpc_train.data_shard()) and that each rank's share holds at least one batch."
            )
        return self.ran_out


class TrainEpochs:
    """The training set's loader and its epochs, for this rank's data-parallel share.

    `global_batch` is ``trainer.batch_size`` (named in the refusal of a training set smaller than one batch).
    Agreeing on a stream's length is a collective: every rank builds its TrainEpochs at the same point.
    """

    def __init__(
        self,
        dataset: Any,
        settings: DataSettings,
        per_rank_batch: int,
        dp_size: int,
        dp_rank: int,
        seed: int,
        collate_fn: Optional[Callable],
        global_batch: int,
    ) -> None:
        self.dataset, self.per_rank_batch = dataset, per_rank_batch
        self.stream = is_stream(dataset)
        if self.stream:
            self.loader = stream_loader(dataset, settings, per_rank_batch, seed, collate_fn)
        else:
            self.loader = train_loader(
                dataset, settings, per_rank_batch, dp_size, dp_rank, seed=seed, collate_fn=collate_fn
            )
        self.steps_per_epoch = self._count_steps_per_epoch(global_batch)
        # A stream with state_dict() read through torchdata's StatefulDataLoader: its position is checkpointed per rank.
        self.exact_resume = self.stream and hasattr(self.loader, "load_state_dict")
        self._skip_on_resume = 0  # batches of a stream without state to re-read and drop after a resume

    def _count_steps_per_epoch(self, global_batch: int) -> Optional[int]:
        """Optimizer steps per epoch; None for a stream without a length (its epoch ends when it runs out)."""
        if self.stream and not has_length(self.dataset):
            return None
        steps = len(self.loader)
        if self.stream:  # each rank's share has its own length: every rank stops at the shortest
            steps = -distributed.all_reduce_max_int(-steps)
        if steps == 0:
            size = f"{len(self.dataset)} samples" + (" on some rank" if self.stream else "")
            raise ValueError(
                f"trainer.batch_size={global_batch} is larger than the training set ({size}): lower trainer.batch_size."
            )
        return steps

    def steps_without_length(self, max_steps: Optional[int], epochs: Any) -> int:
        """The run's length for a stream without one: trainer.max_steps (`max_steps`) steps, the stream re-read from
        its start whenever it runs out; `epochs` (trainer.epochs) does not apply."""
        name = type(self.dataset).__name__
        if max_steps is None:
            raise Refusal(
                f"`trainer.max_steps`: data.train ({name}) is a stream without a length, so trainer.epochs cannot be"
                " turned into a number of steps. Fix: set trainer.max_steps=N (the stream is read again from its start"
                " whenever it runs out), or give the dataset a __len__."
            )
        if epochs is not None:
            log.info(
                "data.train (%s) has no length: training for trainer.max_steps=%d steps (trainer.epochs=%s does not"
                " apply; the stream starts over when it runs out)",
                name,
                max_steps,
                epochs,
            )
        return int(max_steps)

    def describe(self) -> str:
        return "an epoch ends with the stream" if self.steps_per_epoch is None else f"{self.steps_per_epoch} per epoch"

    def inside_epoch(self, step_in_epoch: int) -> bool:
        """Whether a position is known to be inside its epoch, not at its end (a stream without a length cannot
        tell)."""
        return self.steps_per_epoch is not None and step_in_epoch < self.steps_per_epoch

    def resume_at(self, epoch: int, step_in_epoch: int, resharded: bool) -> None:
        """After a checkpoint was restored at (`epoch`, `step_in_epoch`): a stream whose position was not restored
        (a stream without state, or a checkpoint `resharded` from another number of ranks) re-reads the epoch
        from its start at the next :meth:`open` and drops the batches already trained on."""
        if not self.stream or (self.exact_resume and not resharded):
            return
        self._skip_on_resume = step_in_epoch
        log.warning(
            "data.train (%s) is a stream %s: resuming by re-reading epoch %d from its start and skipping the %d"
            " batches already trained on (exact for a stream that yields the same items in the same order)",
            type(self.dataset).__name__,
            (
                "read without torchdata (pip install torchdata for an exact restart from its state_dict())"
                if is_stateful(self.dataset)
                else "without state_dict()/load_state_dict()"
            ),
            epoch,
            self._skip_on_resume,
        )

    def open(self, epoch: int, step_in_epoch: int) -> Epoch:
        """Epoch `epoch`'s batches from the loop's position, `step_in_epoch` steps in (mid-epoch after a resume)."""
        if not self.stream:
            sampler = self.loader.sampler
            sampler.set_epoch(epoch)
            sampler.skip_batches(step_in_epoch, self.per_rank_batch)
            return Epoch(self, epoch, iter(self.loader))
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)
        batches = iter(self.loader)  # a restored StatefulDataLoader continues where it stopped
        for _ in range(self._skip_on_resume):  # a stream without state: re-read what the lost attempt consumed
            next(batches, None)
        self._skip_on_resume = 0
        return Epoch(self, epoch, self._while_every_rank_has_one(batches, step_in_epoch))

    def _while_every_rank_has_one(self, batches: Iterator[Any], step_in_epoch: int) -> Iterator[Any]:
        """A stream's batches while every rank still has one (and the epoch's length is not reached): a rank whose
        share runs out first ends the epoch everywhere, instead of leaving the others waiting in a collective."""
        while self.steps_per_epoch is None or step_in_epoch < self.steps_per_epoch:
            batch = next(batches, _END)
            if distributed.all_reduce_max_int(int(batch is _END)):  # one collective a step, all ranks alike
                return
            yield batch
            step_in_epoch += 1  # the loop took its step on it
