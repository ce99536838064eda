"""records/as_found.py: files put back exactly as found, and the folders a command made removed again."""

import os

from hpc_train.records import as_found


def test_files_are_put_back_with_their_bytes_and_times_and_an_absent_one_removed(tmp_path):
    kept, absent = tmp_path / "config.yaml", tmp_path / "overrides.yaml"
    kept.write_bytes(b"the run's config\n")
    os.utime(kept, ns=(1_000_000_000, 2_000_000_000))
    found = as_found.FilesAsFound.take([kept, absent])
    kept.write_bytes(b"a refused command's config\n")
    absent.write_bytes(b"written by the refused command\n")

    found.put_back()

    times = kept.stat()  # before reading it back, which sets its atime
    assert (times.st_atime_ns, times.st_mtime_ns) == (1_000_000_000, 2_000_000_000)
    assert kept.read_bytes() == b"the run's config\n"
    assert not absent.exists()
    assert not found.absent()


def test_a_log_is_cut_back_to_its_found_size(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("the run's line\n")
    found = as_found.LogAsFound.take(log)
    with log.open("a") as handle:
        handle.write("a refused command's line\n")

    found.cut_back()

    assert log.read_text() == "the run's line\n"


def test_made_folders_are_removed_up_to_the_top_and_no_further(tmp_path):
    (tmp_path / "outputs").mkdir()  # there before the command, empty: not its to remove
    top = as_found.highest_missing(tmp_path / "outputs" / "day" / "time")
    assert top == tmp_path / "outputs" / "day"
    made = as_found.fresh_dir(tmp_path / "outputs" / "day" / "time")
    (made / ".hydra").mkdir()
    (made / ".hydra" / "config.yaml").write_text("x: 1\n")

    as_found.remove_made(made, top)

    assert not (tmp_path / "outputs" / "day").exists()
    assert (tmp_path / "outputs").is_dir()


def test_a_made_folder_that_another_command_wrote_into_stays(tmp_path):
    top = as_found.highest_missing(tmp_path / "day" / "time")
    made = as_found.fresh_dir(tmp_path / "day" / "time")
    other = as_found.fresh_dir(tmp_path / "day" / "time")  # the same second, another command
    assert other == tmp_path / "day" / "time-1"

    as_found.remove_made(made, top)

    assert not made.exists()
    assert other.is_dir()
