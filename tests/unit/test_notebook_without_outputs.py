"""notebooks/demo_model_parallelism.ipynb is committed without outputs."""

from __future__ import annotations

import re

from tests.support.paths import REPO

NOTEBOOK = REPO / "notebooks" / "demo_model_parallelism.ipynb"


def load():
    import nbformat

    return nbformat.read(str(NOTEBOOK), as_version=4)


def test_notebook_is_committed_without_outputs():
    nb = load()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    for name in (
        "MODEL",
        "IMAGE_SIZE",
        "BATCH_SIZE",
        "MICRO_BATCHES",
        "CPU_SCALE_DOWN",
        "CPU_BUDGET_S",
        "SUBMIT",
        "SLURM_OVERRIDES",
        "SLURM_CPUS_PER_GPU",
    ):
        assert re.search(rf"^{name} = ", first.source, flags=re.M), name
    source = "\n".join(cell.source for cell in code)
    # Only the public API: jobs through hpc_train.run/sweep, the timing cell through hpc_train.staged_model.
    for public in ("hpc_train.compose(", "hpc_train.staged_model(", "hpc_train.run(", "hpc_train.sweep("):
        assert public in source, public
    assert "hpc_train.compute" not in source and "hpc_train.cli" not in source and "hpc_train.launch" not in source
