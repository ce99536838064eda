"""The memory check before queueing, measured on the login side.

1. Its cost where it is off: `hpc-train launcher=slurm dry_run=true` (the slurm profile declares no GPU memory, so
   resources.memory_check=auto starts no process) against the same dry run of another checkout (--baseline-tree, a
   version without the check), fresh processes, interleaved, one warm-up each, then `repeats` pairs.
2. Its own cost: the same dry run with cluster.gpu_memory_gb=80 (the estimate runs, in a process of its own) on the
   default model and on a small Llama-style one (examples/llama_project), both fsdp over 4.
3. A 7B Llama-style job (dim 4096, 32 blocks, SwiGLU 11008, 32 heads, vocab 32000, 2048 tokens, 8 sequences) on
   8 GPUs of a declared 80 GB, plain DDP (--strategy): refused before anything is queued, in how many seconds (and
   when its verdict line came, before its settings were estimated), with which settings; with --verify, each
   setting pasted into a fresh dry run, which must pass the check (its exit code may still be a later check's: the
   Slurm test cluster's nodes have 4 GPUs, not 8).

Writes results/memory_check.json.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO,
    RESULTS,
    cpu_env,
    fmt_stats,
    git_commit,
    hpc_train_cmd,
    import_root,
    read_json,
    stats,
    write_result,
)

PROJECT = REPO / "examples" / "llama_project"
VERDICT = "memory check: the job will not fit"  # the line printed once the job's own estimate refuses it
LLAMA = ["--config-dir", str(PROJECT / "conf"), "model=llama_tiny", "data=herd_log", "trainer=llama"]
SEVEN_B = [
    *LLAMA,
    "model.dim=4096",
    "model.n_layers=32",
    "model.hidden_dim=11008",
    "model.n_heads=32",
    "data.vocab_size=32000",
    "data.seq_len=2048",
    "trainer.batch_size=8",
    "resources.gpus_per_node=8",
    "launcher=slurm",
    "cluster=slurm",
    "cluster.gpu_memory_gb=80",
]


def timed(command: List[str], env: Dict[str, str], cwd: Path, marker: str = "") -> Dict[str, object]:
    """The command's exit code, output and seconds; with `marker`, also the seconds until a line holding it."""
    start, seen = time.perf_counter(), None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker and seen is None and marker in line:
            seen = time.perf_counter() - start
    code = proc.wait()
    return {"seconds": time.perf_counter() - start, "code": code, "out": "".join(lines), "marker_seconds": seen}


def off_cost(repeats: int, env: Dict[str, str], baseline: str) -> dict:
    """The dry run with the check off (auto, no GPU memory declared), against the baseline checkout's."""
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        command = hpc_train_cmd(["launcher=slurm", "dry_run=true", f"hydra.run.dir={tmp}/run"])
        cases = {"this": (env, REPO)}
        if baseline:
            cases["baseline"] = ({**env, "PYTHONPATH": str(import_root(Path(baseline)))}, Path(baseline))
        seconds: Dict[str, List[float]] = {name: [] for name in cases}
        for _ in range(repeats + 1):  # the first pair warms the page cache
            for name, (case_env, cwd) in cases.items():
                run = timed(command, case_env, cwd)
                assert run["code"] == 0, run["out"]
                seconds[name].append(float(run["seconds"]))
    out = {name: stats(values[1:]) for name, values in seconds.items()}
    if baseline:
        out["this_over_baseline"] = stats([a / b for a, b in zip(seconds["this"][1:], seconds["baseline"][1:])])
        out["baseline_commit"] = git_commit(Path(baseline), mark_dirty=False)
    return out


def on_cost(repeats: int, env: Dict[str, str]) -> dict:
    """The dry run with the estimate, on the default job and on a small Llama-style fsdp job."""
    jobs = {
        "default model (resnet18), fsdp over 4": ["launcher=slurm", "strategy=fsdp"],
        "llama, fsdp over 4": [*LLAMA, "strategy=fsdp", "resources.gpus_per_node=4", "launcher=slurm"],
    }
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        for name, overrides in jobs.items():
            command = hpc_train_cmd([*overrides, "cluster.gpu_memory_gb=80", "dry_run=true", f"hydra.run.dir={tmp}/r"])
            runs = [timed(command, env, PROJECT) for _ in range(repeats)]
            assert all(run["code"] == 0 and "memory: rank" in str(run["out"]) for run in runs), runs[0]["out"]
            out[name] = stats([float(run["seconds"]) for run in runs])
    return out


def seven_b(strategy: str, verify: bool, env: Dict[str, str]) -> dict:
    """The 7B job refused, its settings that fit, and (verify) each pasted into a fresh dry run."""
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        job = [*SEVEN_B, f"strategy={strategy}", "dry_run=true", f"hydra.run.dir={tmp}/r"]
        run = timed(hpc_train_cmd(job), env, PROJECT, marker=VERDICT)
        text = str(run["out"])
        settings = re.findall(r"^  (.+): ([0-9.]+ GiB of [0-9.]+ GiB \([0-9]+ %\))$", text, flags=re.M)
        out = {"seconds": run["seconds"], "verdict_seconds": run["marker_seconds"], "code": run["code"]}
        out["refusal"] = text[text.find("hpc-train: invalid") :]
        out["settings"] = [{"overrides": o, "need": need} for o, need in settings]
        for setting in out["settings"] if verify else []:
            pasted = timed(hpc_train_cmd([*job, *setting["overrides"].split()]), env, PROJECT)
            setting["pasted_code"], setting["pasted_seconds"] = pasted["code"], pasted["seconds"]
            setting["pasted_memory"] = re.findall(r"memory: (rank .*? \([0-9]+ %\))", str(pasted["out"]))
            setting["passed_check"] = bool(setting["pasted_memory"]) and "will not fit" not in str(pasted["out"])
            setting["pasted_last_line"] = str(pasted["out"]).strip().splitlines()[-1]  # e.g. a later check's refusal
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-tree", default="", help="a checkout without the check (git archive COMMIT)")
    parser.add_argument("--strategy", default="ddp", help="the 7B job's strategy (plain DDP by default)")
    parser.add_argument("--verify", action="store_true", help="paste each setting into a fresh dry run")
    parser.add_argument("--only", choices=("off", "on", "7b"), action="append")
    args = parser.parse_args()
    env, parts = cpu_env(2), set(args.only or ("off", "on", "7b"))
    previous = RESULTS / "memory_check.json"  # the parts not run this time are kept
    result: Dict[str, object] = {**(read_json(previous) if previous.exists() else {}), "commit": git_commit()}
    if "off" in parts:
        result["off"] = off = off_cost(args.repeats, env, args.baseline_tree)
        print(f"dry run, check off: {fmt_stats(off['this'])} s")
        if args.baseline_tree:
            ratio = fmt_stats(off["this_over_baseline"], 3)
            print(f"the same at the baseline: {fmt_stats(off['baseline'])} s, ratio {ratio}")
    if "on" in parts:
        result["on"] = on = on_cost(max(1, args.repeats // 2), env)
        for name, figures in on.items():
            print(f"dry run with the estimate, {name}: {fmt_stats(figures)} s")
    if "7b" in parts:
        result["7b"] = seven = seven_b(args.strategy, args.verify, env)
        verdict = seven["verdict_seconds"]
        print(f"7B, strategy={args.strategy}: exit {seven['code']} after {seven['seconds']:.1f} s, verdict {verdict} s")
        print(seven["refusal"])
        for setting in seven["settings"]:
            print(
                f"  pasted {setting['overrides']}: passed the check {setting.get('passed_check')}, exit"
                f" {setting.get('pasted_code')}: {setting.get('pasted_memory')}"
            )
    write_result("memory_check", result)


if __name__ == "__main__":
    main()
