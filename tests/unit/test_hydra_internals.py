"""The Hydra internals hpc_train relies on (hpc_train.launch.hydra.hydra_internals) exist in the installed Hydra, and
the
installed Hydra is in the range pyproject.toml declares: an upgrade that moves one fails here, naming it."""

import importlib
from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement

from hpc_train.launch.hydra import hydra_internals


@pytest.mark.parametrize(
    "module, attribute", hydra_internals.INTERNALS, ids=[".".join(i) for i in hydra_internals.INTERNALS]
)
def test_each_internal_exists_in_the_installed_hydra(module, attribute):
    try:
        found = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as err:
        pytest.fail(
            f"hydra-core {version('hydra-core')} has no {module}.{attribute} ({err}): hpc_train relies on it"
            " (hpc_train/launch/hydra/hydra_internals.py); adapt that module to this Hydra or pin hydra-core to the "
            "tested range"
        )
    assert callable(found)


def test_the_installed_hydra_is_in_the_declared_range():
    (declared,) = [Requirement(r) for r in requires("hpc-train") if Requirement(r).name == "hydra-core"]
    assert str(declared.specifier) and declared.specifier.contains(version("hydra-core")), (
        declared,
        version("hydra-core"),
    )


def test_a_quiet_failure_raises_the_jobs_error_without_hydras_line(capsys):
    """The sweeper reads every return (``_ = r.return_value``): Hydra's getter writes `Error executing job with
    overrides` before it raises; the quiet one raises the same error and writes nothing; a success reads as before."""
    from hydra.core.utils import JobReturn, JobStatus

    failed = JobReturn(overrides=["seed=2"], status=JobStatus.FAILED, _return_value=RuntimeError("job 7 failed"))
    with pytest.raises(RuntimeError, match="job 7 failed"):
        _ = failed.return_value
    assert "Error executing job with overrides: ['seed=2']" in capsys.readouterr().err  # what the quiet one replaces
    quiet = hydra_internals.quiet_failure(failed)
    assert hydra_internals.job_error(quiet) is failed._return_value and quiet.overrides == ["seed=2"]
    with pytest.raises(RuntimeError, match="job 7 failed"):
        _ = quiet.return_value
    assert capsys.readouterr().err == ""
    done = hydra_internals.quiet_failure(JobReturn(status=JobStatus.COMPLETED, _return_value=0.5))
    assert done.return_value == 0.5 and hydra_internals.job_error(done) is None
