"""An adaptive sweep's journal in optuna-dashboard, as users open it (`optuna-dashboard <sweep dir>/study.journal`),
rendered by a real headless browser (Debian's chromium, which scripts/browser_test_tool.sh installs): the trials page
lists every trial with its state, and shows each one's parameters, rung values (intermediate values at the rungs'
budgets) and hpc_train's user attributes; a rung the controller writes while the dashboard runs shows on the next load.

The journal is written through hpc_train.jobs.study.storage (the sweeper's lock) as the controller writes it: asked
with the search space's distributions, each finished rung an intermediate value, the last rung told COMPLETE, a trial
stopped at the end of the study PRUNED, a paused or running one RUNNING."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List

import optuna  # the test extra installs it, and optuna-dashboard
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hpc_train.jobs import study as names

BIN = Path(sys.executable).parent
BUDGETS = (1, 3, 9)  # the rungs' budgets: the steps of the intermediate values
# number -> (the rung values it finished, its status); a rung is 0-based, its budget BUDGETS[rung]
TRIALS = {
    0: ((0.5, 0.3, 0.2), "completed"),  # all three rungs: COMPLETE with value 0.2
    1: ((0.7, 0.6), "stopped"),  # paused after rung 1 when the study ended: PRUNED
    2: ((0.8,), "paused"),  # paused after rung 0, may be promoted: RUNNING
    3: ((0.75,), "running"),  # promoted, runs rung 1: RUNNING
}
STATES = {"completed": "Complete", "stopped": "Pruned", "paused": "Running", "running": "Running"}


def _space():
    return {
        "trainer.lr": FloatDistribution(1e-4, 1e-1, log=True),
        "model.hidden": IntDistribution(16, 128),
        "trainer.optimizer": CategoricalDistribution(["adam", "sgd"]),
    }


def _rung_done(study, storage, number: int, values, status: str) -> None:
    """What the controller writes when a trial's rung ends (controller._rung_done), and at the study's end."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    rung = len(values) - 1
    storage.set_trial_intermediate_value(trial_id, BUDGETS[rung], values[-1])
    attrs = {names.RUNG: rung, names.RUNG_VALUES: {str(r): v for r, v in enumerate(values)}, names.STATUS: status}
    if status == "running":  # promoted: its next rung started
        attrs[names.RUNG] = rung + 1
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    if status == "completed":
        study.tell(number, values[-1], state=TrialState.COMPLETE)
    elif status == "stopped":
        study.tell(number, state=TrialState.PRUNED)


def _new_trial(study, storage, sweep_dir: Path) -> int:
    trial = study.ask(fixed_distributions=_space())
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, trial.number)
    run_dir = str(sweep_dir / str(trial.number))
    attrs = {names.BRACKET: 0, names.RUNG: 0, names.STATUS: "running", names.RUN_DIR: run_dir}
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    return trial.number


def _write_study(sweep_dir: Path):
    sweep_dir.mkdir(parents=True)
    storage = names.storage(sweep_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(storage=storage, study_name=names.STUDY_NAME, direction="minimize", sampler=sampler)
    for values, status in TRIALS.values():
        number = _new_trial(study, storage, sweep_dir)
        for rung in range(len(values)):
            _rung_done(study, storage, number, values[: rung + 1], "paused" if rung + 1 < len(values) else status)
    return study, storage


# The dashboard's port: a free one below the kernel's ephemeral range (32768-60999 here), which a port-0 bind or an
# outgoing connection never takes between this check and the server's own bind (the CLI cannot be handed a socket),
# and below the local launcher's job and step port blocks (hpc_train.processes.rank_env: from 10000).
DASHBOARD_PORTS = range(8100, 9000)


def _free_port() -> int:
    start = os.getpid() % len(DASHBOARD_PORTS)
    for offset in range(len(DASHBOARD_PORTS)):
        port = DASHBOARD_PORTS[(start + offset) % len(DASHBOARD_PORTS)]
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail(f"no free port in {DASHBOARD_PORTS}")


@pytest.fixture
def dashboard(tmp_path):
    """`optuna-dashboard <journal>` on a free port, up once its API answers; stopped at the end."""
    sweep_dir = tmp_path / "sweep"
    study, storage = _write_study(sweep_dir)
    port, log = _free_port(), tmp_path / "dashboard.log"
    assert (BIN / "optuna-dashboard").exists(), 'optuna-dashboard is not installed: pip install -e ".[test]"'
    command = [str(BIN / "optuna-dashboard"), str(names.journal_path(sweep_dir)), "--host", "127.0.0.1"]
    with open(log, "wb") as out:
        server = subprocess.Popen([*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"optuna-dashboard exited {server.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"optuna-dashboard does not answer on {url}:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url, study, storage, sweep_dir
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


class _Text(HTMLParser):
    """The page's text nodes, in order (scripts and styles left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: List[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip and data.strip():
            self.texts.append(data.strip())


def _page_text(url: str, profile: Path) -> List[str]:
    """The page's text once its JavaScript ran, as headless chromium renders it (--dump-dom)."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is not installed: run `bash scripts/browser_test_tool.sh install` (as root)")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}"]
    command += ["--virtual-time-budget=10000", "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    parser = _Text()
    parser.feed(done.stdout)
    return parser.texts


def _wait_for_trials(url: str, study_id: int, count: int) -> None:
    """Until the dashboard's API holds count trials: it reads the journal again once its cache of the study's trials is
    older than a few seconds (2 s under 100 trials)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{url}/api/studies/{study_id}", timeout=10) as answer:
            trials = json.load(answer)["trials"]
        if len(trials) == count:
            return
        assert time.monotonic() < deadline, f"the dashboard still shows {len(trials)} trials, not {count}, after 30 s"
        time.sleep(0.5)


def _trial_sections(texts: List[str]) -> Dict[int, List[str]]:
    """The trials page's detail panes: each trial's texts from its heading 'Trial N (trial_id=...)' to the next."""
    sections: Dict[int, List[str]] = {}
    current = None
    for text in texts:
        if text.startswith("Trial ") and "(trial_id=" in text:
            current = sections.setdefault(int(text.split()[1]), [])
        if current is not None:
            current.append(text)
    return sections


def _between(section: List[str], first: str, last: str) -> List[str]:
    return section[section.index(first) + 1 : section.index(last)]


def _assert_trial(section: List[str], trial, values, status: str) -> None:
    assert section[1] == STATES[status], section
    steps = [f"{BUDGETS[rung]} {value}" for rung, value in enumerate(values)]
    assert _between(section, "Intermediate Values", "Parameter") == steps, section
    assert _between(section, "Parameter", "Started At") == [f"{k} {v}" for k, v in trial.params.items()], section
    attrs = _between(section, "User Attributes", section[-1]) + [section[-1]]
    assert f"{names.STATUS} {status}" in attrs, section
    assert f"{names.RUN_DIR} {trial.user_attrs[names.RUN_DIR]}" in attrs, section


def test_the_dashboard_shows_the_trials_their_rung_values_and_a_new_rung(dashboard, tmp_path):
    url, study, storage, sweep_dir = dashboard
    study_id = storage.get_study_id_from_name(names.STUDY_NAME)
    trials = study.get_trials(deepcopy=False)
    numbers = ",".join(str(number) for number in TRIALS)
    page = f"{url}/dashboard/studies/{study_id}/trials?numbers={numbers}"
    texts = _page_text(page, tmp_path / "profile")
    assert names.STUDY_NAME in " ".join(texts), texts
    assert f"{len(TRIALS)} Trials" in texts, texts
    sections = _trial_sections(texts)
    assert sorted(sections) == sorted(TRIALS), texts
    for number, (values, status) in TRIALS.items():
        _assert_trial(sections[number], trials[number], values, status)

    # the controller goes on while the dashboard runs: trial 3 finishes rung 1 and a new trial starts
    _rung_done(study, storage, 3, (0.75, 0.55), "paused")
    new = _new_trial(study, storage, sweep_dir)
    _wait_for_trials(url, study_id, len(TRIALS) + 1)
    texts = _page_text(f"{url}/dashboard/studies/{study_id}/trials?numbers=3,{new}", tmp_path / "profile")
    assert f"{len(TRIALS) + 1} Trials" in texts, texts
    sections = _trial_sections(texts)
    _assert_trial(sections[3], study.trials[3], (0.75, 0.55), "paused")
    assert _between(sections[new], "Intermediate Values", "Parameter") == [], sections[new]
