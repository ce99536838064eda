"""The sweep's job table (hpc_train.jobs.job_table): one writer, one reader; the format is what the report, --watch,
the rerun and the Python API read."""

from hpc_train.jobs import job_table
from hpc_train.jobs.job_table import JobRow


def test_rows_round_trip_with_quotes_and_interpolations_and_a_rerun_replaces_its_job(tmp_path):
    first = [
        JobRow("17_0", "0", "trainer.lr=0.1 'model.name=\"a b\"'", "1 node(s) x 2 task(s)"),
        JobRow("17_1", "1", "x='${y}'", "1 node(s) x 1 task(s), gres gpu:1"),
    ]
    assert job_table.append(tmp_path, first) is True
    assert job_table.append(tmp_path, [JobRow("18", "1", "x='${y}'", "1 node(s) x 1 task(s), gres gpu:1")]) is False
    text = (tmp_path / "jobs.tsv").read_text()
    assert text.splitlines()[0] == "job_id\tjob\toverrides\tlayout"  # the file format every reader knows
    assert text.splitlines()[1] == "17_0\t0\ttrainer.lr=0.1 'model.name=\"a b\"'\t1 node(s) x 2 task(s)"
    assert job_table.read(tmp_path) == [*first, JobRow("18", "1", "x='${y}'", "1 node(s) x 1 task(s), gres gpu:1")]
    assert {n: r.job_id for n, r in job_table.newest(tmp_path).items()} == {"0": "17_0", "1": "18"}


def test_no_table_reads_as_no_rows(tmp_path):
    assert job_table.read(tmp_path) == [] and job_table.newest(tmp_path) == {}


def test_printed_table_is_aligned_and_says_where_it_went(tmp_path, capsys):
    job_table.print_and_append(tmp_path, [JobRow("5", "0", "seed=1", "1 node(s) x 1 task(s)")])
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["job_id  job  overrides  layout", "5       0    seed=1     1 node(s) x 1 task(s)"]
    assert out[2] == f"hpc-train: job table saved to {tmp_path / 'jobs.tsv'}"
