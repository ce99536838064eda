"""A rank that dies without an exception (a signal, a bare exit status) is named as the cause.

Real gloo ranks under the local launcher; rank 1 dies at its third step, rank 0 then loses its
connection: the message must blame rank 1 with the cause in words, and call rank 0's failure a
consequence.
"""

import os

import pytest

from tests.support.cli import TINY, run_cli

DDP = ["strategy=ddp", "resources.gpus_per_node=2", "trainer.epochs=null", "trainer.max_steps=20", "trainer.eval=false"]
STEP = "trainer.step={_target_:tests.support.user_steps.dies_on_rank_1,_partial_:true}"


@pytest.mark.parametrize(
    "death, words",
    [
        ("KILL", "was killed by SIGKILL (signal 9): usually the kernel's out-of-memory killer, but a node failure"),
        ("SEGV", "was killed by SIGSEGV (signal 11)"),
        ("EXIT", "failed first (SystemExit: 3)"),  # sys.exit(3) is not taken for hpc_train's own exit code 3
    ],
)
def test_a_rank_that_dies_without_an_exception_is_named_as_the_cause(death, words, tmp_path):
    proc = run_cli([*TINY, *DDP, STEP], tmp_path / "run", env=dict(os.environ, TEST_DEATH=death), timeout=120)
    assert proc.returncode != 0
    blame = [line for line in proc.stderr.splitlines() if "stopping the other ranks" in line]
    assert len(blame) == 1 and blame[0].startswith("hpc-train: rank 1 ") and words in blame[0], proc.stderr
    assert "rank 0 failed first" not in proc.stderr, "rank 0's lost connection is not the failure"
