"""benchmarks/against_example.py: interleaved rounds, ratios to the same round's example, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import against_example as ae

ROOT = Path(__file__).resolve().parents[2]


def fake_run(speeds: dict[tuple[int, str], float], calls: list[str]):
    """A `run` whose figures depend on (round, config); every round runs each config of `speeds` once."""
    per_round = len({name for _, name in speeds})

    def run(name: str) -> dict:
        rnd = len(calls) // per_round + 1
        calls.append(name)
        speed = speeds[(rnd, name)]
        return {
            "samples_per_s_median": speed,
            "samples_per_cpu_s": speed / 2,
            "peak_rss_mb_per_rank": [100.0, 100.0 + speed / 1000],
            "eval_auc": None if name == ae.EXAMPLE else 0.7,
        }

    return run


def test_rounds_alternate_their_order():
    assert ae.round_order(["fp32", "bf16"], 1) == ["example", "fp32", "bf16"]
    assert ae.round_order(["fp32", "bf16"], 2) == ["bf16", "fp32", "example"]
    assert ae.round_order(["fp32", "bf16"], 3) == ["example", "fp32", "bf16"]


def test_each_ratio_is_to_the_same_rounds_example():
    # The example's speed changes from round to round (a shared machine); ours is 2x and 3x it in
    # every round, so every ratio must be exactly 2 and 3, whatever the other rounds' speeds.
    example = {1: 30_000.0, 2: 10_000.0, 3: 20_000.0}
    speeds = {}
    for rnd, base in example.items():
        speeds[(rnd, "example")] = base
        speeds[(rnd, "fp32")] = 2 * base
        speeds[(rnd, "bf16")] = 3 * base
    calls: list[str] = []
    lines: list[str] = []
    saved: list[int] = []
    rows = ae.compare(["fp32", "bf16"], 3, fake_run(speeds, calls), lines.append, lambda r: saved.append(len(r)))
    assert calls == ["example", "fp32", "bf16", "bf16", "fp32", "example", "example", "fp32", "bf16"]
    assert saved == [3, 6, 9]  # after each round
    first = [(row["round"], row["config"]) for row in rows][:4]
    assert first == [(1, "example"), (1, "fp32"), (1, "bf16"), (2, "bf16")]
    result = ae.summary(rows, ["fp32", "bf16"])
    assert result["fp32"]["samples_per_s_ratio"]["per_round"] == [2.0, 2.0, 2.0]
    assert result["bf16"]["samples_per_s_ratio"] == {"median": 3.0, "min": 3.0, "max": 3.0, "per_round": [3.0] * 3}
    assert result["bf16"]["samples_per_cpu_s_ratio"]["median"] == 3.0
    assert result["example"]["samples_per_s_median"] == 20_000.0 and "samples_per_s_ratio" not in result["example"]
    assert result["fp32"]["samples_per_s_median"] == 40_000.0
    # peak RSS: the largest rank's, to the example's of the same round
    assert result["fp32"]["peak_rss_mb_ratio"]["per_round"] == pytest.approx([160 / 130, 120 / 110, 140 / 120])
    assert "round 2/3: samples/s to the example's: fp32 2.00x, bf16 3.00x" in lines
    assert any("eval AUC 0.70000" in line for line in lines)
    text = "\n".join(ae.table(result))
    assert "bf16 (" in text and "3.00x (3.00-3.00)" in text


def test_median_min_max_over_rounds():
    speeds = {}
    for rnd, ratio in enumerate([1.2, 1.5, 1.3], start=1):
        speeds[(rnd, "example")] = 1000.0
        speeds[(rnd, "fp32")] = 1000.0 * ratio
    rows = ae.compare(["fp32"], 3, fake_run(speeds, []), lambda line: None)
    r = ae.summary(rows, ["fp32"])["fp32"]["samples_per_s_ratio"]
    assert r["median"] == pytest.approx(1.3) and r["min"] == pytest.approx(1.2) and r["max"] == pytest.approx(1.5)


def test_commands_launch_each_setup_as_documented(tmp_path):
    out = tmp_path / "f.json"
    cmd, env = ae.command("example", ["--windows", "3"], out, cache_batches=10)
    assert cmd[1:3] == ["-m", "dlrm.torchrun"] and "--nproc_per_node=2" in cmd
    assert cmd[cmd.index("--nproc_per_node=2") + 1] == str(ae.EXAMPLE_SCRIPT) and ae.EXAMPLE_SCRIPT.is_file()
    assert "--cache-batches" not in cmd and cmd[-2:] == ["--out", str(out)] and "--windows" in cmd
    cmd, env = ae.command("bf16", [], out, cache_batches=10)
    tail = ["-m", "dlrm.bench", "--out", str(out), "trainer.dense_precision=bf16", "--cache-batches", "10"]
    assert cmd[1:3] == ["-m", "dlrm.torchrun"] and cmd[-7:] == tail
    assert env["OMP_NUM_THREADS"] == "1"
    cmd, env = ae.command("bf16_1p2t", [], out, cache_batches=0)
    assert cmd[0] == sys.executable and cmd[1:3] == ["-m", "dlrm.bench"] and "dlrm.torchrun" not in cmd
    assert env["OMP_NUM_THREADS"] == "2" and "trainer.dense_precision=bf16" in cmd and "--cache-batches" not in cmd
    cmd, env = ae.command("fp32", [], out, cache_batches=0)
    assert not any(arg.startswith("trainer.") for arg in cmd)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/against_example.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--configs", "fp32,fast"], "unknown or empty ['fast']"),
        (["--configs", "example"], "unknown or empty ['example']"),
        (["--configs", ","], "unknown or empty ','"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--windows", "0"], "--windows must be >= 1, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--timeout", "0"], "--timeout > 0"),
    ],
)
def test_bad_options_exit_2_with_one_line_before_any_run(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no run started


def test_a_failed_run_stops_with_its_command_and_keeps_the_completed_rounds(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    calls = {"n": 0}

    def run_once(name, timing, cache_batches, timeout_s):
        calls["n"] += 1
        if calls["n"] > 2:  # round 2's first run fails
            raise ae.RunFailed(f"{name}: exited 1: python -m dlrm.bench\nTraceback: boom")
        return {"samples_per_s_median": 10.0, "samples_per_cpu_s": 5.0, "peak_rss_mb_per_rank": [1.0]}

    monkeypatch.setattr(ae, "run_once", run_once)
    with pytest.raises(SystemExit) as e:
        ae.main(["--rounds", "3", "--configs", "fp32", "--out", str(out)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: fp32: exited 1: python -m dlrm.bench") and "boom" in err
    record = json.loads(out.read_text())
    assert record["rounds_requested"] == 3 and record["rounds_completed"] == 1 and len(record["runs"]) == 2


def test_a_run_without_figures_is_a_failure(tmp_path, monkeypatch):
    # the program exits 0 but writes no --out file: reported, not read as a result
    monkeypatch.setattr(ae, "command", lambda name, timing, out, cb: ([sys.executable, "-c", "print('hi')"], {}))
    with pytest.raises(ae.RunFailed, match="fp32: exited 0"):
        ae.run_once("fp32", [], 0, 60)


@pytest.mark.slow
@pytest.mark.long
def test_one_real_round_against_the_example(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("--rounds", "1", "--configs", "bf16_1p1t", "--warmup", "1", "--window", "2", "--windows", "2",
                   "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert [run["config"] for run in record["runs"]] == ["example", "bf16_1p1t"]
    ratio = record["summary"]["bf16_1p1t"]["samples_per_s_ratio"]["per_round"][0]
    runs = record["runs"]
    assert ratio == pytest.approx(runs[1]["samples_per_s"] / runs[0]["samples_per_s"])
    assert 0.0 < runs[1]["eval_auc"] < 1.0 and runs[0]["eval_auc"] is None
    assert "bf16_1p1t (ours, 1 process x 1 thread" in proc.stdout


def test_a_timed_out_run_is_stopped_with_all_its_processes(tmp_path, monkeypatch):
    # The run starts a child that would outlive it (as torchrun's ranks would): the timeout stops both.
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(300)\n"
    )
    monkeypatch.setattr(ae, "command", lambda name, timing, out, cb: ([sys.executable, "-c", script], None))
    with pytest.raises(ae.RunFailed, match=r"fp32: no result within 3 s \(--timeout\)"):
        ae.run_once("fp32", [], 0, 3)
    for pid in map(int, pids.read_text().split()):
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"), pid  # gone or a zombie
