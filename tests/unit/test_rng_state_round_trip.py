"""The RNG states a checkpoint stores come back equal through a weights-only load."""

from __future__ import annotations

import io

import torch


def test_rng_states_survive_a_weights_only_round_trip():
    import random

    import numpy as np

    from hpc_train.compute.checkpointing.files import capture_rng, restore_rng

    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    np.random.standard_normal()  # numpy caches a second gaussian: its state must survive too
    random.gauss(0, 1)
    buffer = io.BytesIO()
    torch.save(capture_rng(), buffer)
    expected = (
        random.random(),
        random.gauss(0, 1),
        np.random.standard_normal(),
        np.random.randint(1 << 30),
        torch.rand(3),
    )
    restore_rng(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    again = (
        random.random(),
        random.gauss(0, 1),
        np.random.standard_normal(),
        np.random.randint(1 << 30),
        torch.rand(3),
    )
    assert expected[:4] == again[:4] and torch.equal(expected[4], again[4])
