"""Training steps for the tests (trainer.step=tests.support.user_steps.NAME): one exactly like the built-in step, and
the broken ones the start-of-job check must refuse."""

import torch.nn.functional as F


def cross_entropy(model, batch):
    """The built-in step written as a user would: same operations, so bit-identical weights."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def raises(model, batch):
    return model(**batch)  # (input, target) pairs are a tuple: TypeError


def per_sample_loss(model, batch):
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels, reduction="none")


def no_loss_key(model, batch):
    inputs, labels = batch
    return {"total": F.cross_entropy(model(inputs), labels)}


_calls = {"n": 0}


def dies_on_rank_1(model, batch):
    """The built-in computation, but rank 1 dies at its third training step as TEST_DEATH says: KILL (what the
    out-of-memory killer sends), SEGV, or EXIT (sys.exit(3), no exception)."""
    import os
    import signal
    import sys

    import torch

    if torch.is_grad_enabled():  # not the start-of-job check, which runs under no_grad
        _calls["n"] += 1
        if os.environ.get("RANK") == "1" and _calls["n"] == 3:
            how = os.environ["TEST_DEATH"]
            if how == "EXIT":
                sys.exit(3)
            os.kill(os.getpid(), getattr(signal, f"SIG{how}"))
    return cross_entropy(model, batch)


def _hangs_here(ranks: str) -> bool:
    """True at the third training step of a rank in `ranks` ("1" or "all"): the hang tests' trigger."""
    import os

    import torch

    if not torch.is_grad_enabled():  # the start-of-job check runs under no_grad
        return False
    _calls["n"] += 1
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ.get("RANK", "0"))
    return _calls["n"] == 3 and (ranks == "all" or str(rank) == ranks)


SLEEPING_DIR = "TEST_SLEEPING_DIR"  # where sleeps_forever leaves rank<RANK>, once it sleeps (if set)


def sleeps_forever(seconds: float = 3600.0) -> None:
    import os
    import time
    from pathlib import Path

    if os.environ.get(SLEEPING_DIR):  # a test waits for it instead of the progress record (published every 15 s)
        (Path(os.environ[SLEEPING_DIR]) / f"rank{os.environ.get('RANK', '0')}").touch()
    time.sleep(seconds)


def sleeps_on_rank_1(model, batch):
    """The built-in computation, but rank 1 sleeps for an hour in its third step (a hung rank)."""
    if _hangs_here("1"):
        sleeps_forever()
    return cross_entropy(model, batch)


def sleeps_on_every_rank(model, batch):
    """Every rank sleeps for an hour in its third step (a dead file system; no collective is pending)."""
    if _hangs_here("all"):
        sleeps_forever()
    return cross_entropy(model, batch)


def sleeps_in_replica_group_1(model, batch):
    """The built-in computation, but rank 1 of replica group 1 sleeps for an hour in its eighth step, in the group's
    first start only (its restart trains on)."""
    import os

    import torch

    if torch.is_grad_enabled() and os.environ.get("HPC_TRAIN_REPLICA_GROUP") == "1":
        _calls["n"] += 1
        if _calls["n"] == 8 and os.environ.get("RANK") == "1" and os.environ.get("HPC_TRAIN_REPLICA_RESTART") == "0":
            sleeps_forever()
    return cross_entropy(model, batch)
