"""Config mappings on the hpc-train command line: a mapping given whole reaches the sbatch script, one set key by key is
refused with a fix that works (Slurm dry runs, which ask sinfo: the command in its own process). Composing alone:
tests/unit/test_config_compose.py; an unknown option or key refused: tests/unit/test_refused_input.py."""

from tests.support.cli import run_cli


def test_a_mapping_given_whole_reaches_the_sbatch_script(tmp_path):
    """The form conf/cluster/slurm.yaml documents: the profile ships `extra: {}`, the option given whole is added."""
    proc = run_cli(["launcher=slurm", "dry_run=true", "cluster.extra={exclusive:true,mail-type:END}"], tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --exclusive" in proc.stdout.splitlines() and "#SBATCH --mail-type=END" in proc.stdout.splitlines()


def test_an_option_set_key_by_key_is_refused_with_a_fix_that_works(tmp_path):
    refused = run_cli(["launcher=slurm", "dry_run=true", "cluster.extra.exclusive=true"], tmp_path / "run")
    assert refused.returncode == 2 and "`cluster.extra.exclusive`" in refused.stderr
    fix = refused.stderr.split("Fix:", 1)[1]
    assert "'cluster.extra={exclusive:...}'" in fix and "+cluster.extra.exclusive=..." in fix
    for override in ("cluster.extra={exclusive:true}", "+cluster.extra.exclusive=true"):
        proc = run_cli(["launcher=slurm", "dry_run=true", override], tmp_path / "run")
        assert proc.returncode == 0 and "#SBATCH --exclusive" in proc.stdout.splitlines(), f"{override}: {proc.stderr}"
