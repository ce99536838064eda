"""A run dir's claim by a holder on another host: live until it goes stale (the claim file's own rules)."""

from __future__ import annotations

import json
import time

import pytest

from hpc_train.records import run_claim


def test_a_claim_from_another_host_is_live_until_it_goes_stale(tmp_path):
    """A holder on another host cannot be asked: its refresh time decides (run_claim.STALE_S)."""
    now = time.time()
    claim = run_claim.Claim(
        "other", "another-host", 4242, None, now - 3600, now - 5, None, ("another-host", 4243, None)
    )
    (tmp_path / run_claim.CLAIM).write_text(json.dumps(claim.__dict__))
    with pytest.raises(run_claim.RunDirBusy, match=r"pid 4242 on another-host .*refreshed \d+ s ago"):
        run_claim.check_free(tmp_path)
    claim.refreshed = now - run_claim.STALE_S - 1
    (tmp_path / run_claim.CLAIM).write_text(json.dumps(claim.__dict__))
    _, taken_over = run_claim.check_free(tmp_path)
    assert taken_over is not None and "not refreshed for" in taken_over
    assert run_claim.check_free(tmp_path, token="other") == (run_claim.read(tmp_path), None), "its own claim"
