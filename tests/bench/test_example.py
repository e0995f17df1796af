"""dlrm/bench/example.py: interleaved rounds, ratios to the same round's example, the CLI;
dlrm/bench/example_timer.py: the real example's script run as is, its training steps timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dlrm.bench import example as ae
from dlrm.bench import example_timer as et
from tests.helpers import REPO_ROOT as ROOT

# A checkout of https://github.com/facebookresearch/dlrm for the tests that run the real example.
EXAMPLE_CHECKOUT = os.environ.get("DLRM_EXAMPLE")
needs_example = pytest.mark.skipif(
    not EXAMPLE_CHECKOUT, reason="set DLRM_EXAMPLE to a checkout of facebookresearch/dlrm to run the real example"
)


@pytest.fixture
def example(tmp_path) -> Path:
    """A stand-in checkout: torchrec_dlrm/dlrm_main.py exists (never run by these tests)."""
    script = tmp_path / "dlrm" / "torchrec_dlrm" / "dlrm_main.py"
    script.parent.mkdir(parents=True)
    script.write_text("raise SystemExit('not run')\n")
    return tmp_path / "dlrm"


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


def test_commands_launch_each_setup_as_documented(tmp_path, example):
    out = tmp_path / "f.json"
    script = et.find_script(example)
    cmd, env = ae.command("example", ["--windows", "3"], out, cache_batches=10, example=script)
    assert cmd[1:3] == ["-m", "dlrm.torchrun"] and "--nproc_per_node=2" in cmd
    # the real script, by the timer, with the example's own flags after "--"
    at = cmd.index("--nproc_per_node=2") + 1
    assert cmd[at : at + 3] == [str(ae.TIMER), "--example", str(script)] and ae.TIMER.is_file()
    assert cmd[cmd.index("--") + 1 :] == list(ae.EXAMPLE_ARGS) and "--batch_size" in ae.EXAMPLE_ARGS
    assert "--cache-batches" not in cmd and "--windows" in cmd and cmd[cmd.index("--out") + 1] == str(out)
    assert env["OMP_NUM_THREADS"] == "1"
    with pytest.raises(ValueError, match="--example"):
        ae.command("example", [], out, cache_batches=0)
    cmd, env = ae.command("bf16", [], out, cache_batches=10)
    tail = ["-m", "dlrm.bench.training", "--out", str(out), "trainer.dense_precision=bf16", "--cache-batches", "10"]
    assert cmd[1:3] == ["-m", "dlrm.torchrun"] and cmd[-7:] == tail
    assert env["OMP_NUM_THREADS"] == "1"
    cmd, env = ae.command("bf16_1p2t", [], out, cache_batches=0)
    assert cmd[0] == sys.executable and cmd[1:3] == ["-m", "dlrm.bench.training"] and "dlrm.torchrun" not in cmd
    assert env["OMP_NUM_THREADS"] == "2" and "trainer.dense_precision=bf16" in cmd and "--cache-batches" not in cmd
    cmd, env = ae.command("fp32", [], out, cache_batches=0)
    assert not any(arg.startswith("trainer.") for arg in cmd)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlrm.bench.example", *args],
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
        (["--example", "/nonexistent/dlrm"], "--example /nonexistent/dlrm: no dlrm_main.py or"),
    ],
)
def test_bad_options_exit_2_with_one_line_before_any_run(args, message, example):
    proc = run_cli("--example", str(example), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no run started


def test_a_failed_run_stops_with_its_command_and_keeps_the_completed_rounds(tmp_path, monkeypatch, capsys, example):
    out = tmp_path / "r.json"
    calls = {"n": 0}

    def run_once(name, timing, cache_batches, timeout_s, example):
        calls["n"] += 1
        if calls["n"] > 2:  # round 2's first run fails
            raise ae.RunFailed(f"{name}: exited 1: python -m dlrm.bench.training\nTraceback: boom")
        return {"samples_per_s_median": 10.0, "samples_per_cpu_s": 5.0, "peak_rss_mb_per_rank": [1.0]}

    monkeypatch.setattr(ae, "run_once", run_once)
    with pytest.raises(SystemExit) as e:
        ae.main(["--example", str(example), "--rounds", "3", "--configs", "fp32", "--out", str(out)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: fp32: exited 1: python -m dlrm.bench.training") and "boom" in err
    record = json.loads(out.read_text())
    assert record["rounds_requested"] == 3 and record["rounds_completed"] == 1 and len(record["runs"]) == 2
    assert record["example"] == str(et.find_script(example)) and record["example_args"] == list(ae.EXAMPLE_ARGS)


def test_a_run_without_figures_is_a_failure(tmp_path, monkeypatch):
    # the program exits 0 but writes no --out file: reported, not read as a result
    monkeypatch.setattr(ae, "command", lambda name, timing, out, cb, ex: ([sys.executable, "-c", "print('hi')"], {}))
    with pytest.raises(ae.RunFailed, match="fp32: exited 0"):
        ae.run_once("fp32", [], 0, 60)


@pytest.mark.slow
@pytest.mark.long
@needs_example
def test_one_real_round_against_the_example(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("--example", EXAMPLE_CHECKOUT, "--rounds", "1", "--configs", "bf16_1p1t", "--warmup", "1",
                   "--window", "2", "--windows", "2", "--out", str(out))  # fmt: skip
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
    monkeypatch.setattr(ae, "command", lambda name, timing, out, cb, ex: ([sys.executable, "-c", script], None))
    with pytest.raises(ae.RunFailed, match=r"fp32: no result within 3 s \(--timeout\)"):
        ae.run_once("fp32", [], 0, 3)
    for pid in map(int, pids.read_text().split()):
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"), pid  # gone or a zombie


def test_the_example_is_required_and_must_hold_the_script(tmp_path):
    proc = run_cli("--configs", "fp32")
    assert proc.returncode == 2 and "--example" in proc.stderr and proc.stdout == ""


def test_the_script_is_found_in_either_checkout_or_given_itself(tmp_path, example):
    script = example / "torchrec_dlrm" / "dlrm_main.py"
    assert et.find_script(example) == script.resolve()  # facebookresearch/dlrm
    assert et.find_script(example / "torchrec_dlrm") == et.find_script(script) == script.resolve()
    torchrec = tmp_path / "torchrec" / "examples" / "dlrm" / "dlrm_main.py"  # TorchRec's own examples/dlrm
    torchrec.parent.mkdir(parents=True)
    torchrec.write_text("")
    assert et.find_script(tmp_path / "torchrec") == torchrec.resolve()
    with pytest.raises(et.ExampleNotFound, match="no dlrm_main.py or torchrec_dlrm/dlrm_main.py"):
        et.find_script(tmp_path / "nothing")


class _Model:
    training = True


class _Pipeline:
    """Stands in for TrainPipelineSparseDist: progress(it) takes one batch, StopIteration at the end."""

    def __init__(self) -> None:
        self._model = _Model()

    def progress(self, it):
        return next(it)


def test_the_clock_times_training_steps_only_in_windows():
    now = {"t": 0.0, "cpu": 0.0}

    class Pipeline(_Pipeline):
        def progress(self, it):  # a step of next(it) seconds, at 2 CPU-seconds per second
            dt = next(it)
            now["t"] += dt
            now["cpu"] += 2 * dt
            return dt

    clock = et.StepClock(warmup=2, window=3, windows=2, clock=lambda: now["t"], cpu_clock=lambda: now["cpu"])
    clock.install(Pipeline)
    pipeline = Pipeline()
    steps = iter([1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0])  # 2 warm-up steps, then 2 windows of 3
    for _ in range(8):
        pipeline.progress(steps)
    pipeline._model.training = False
    pipeline.progress(iter([50.0]))  # evaluation: not a training step
    assert len(clock.marks) == 8 == clock.steps and clock.start == 0.0
    assert clock.rates(batch=60) == pytest.approx([3 * 60 / 6.0, 3 * 60 / 3.0])
    assert clock.cpu_seconds() == pytest.approx(2 * 9.0)  # over the windows only
    with pytest.raises(StopIteration):
        Pipeline().progress(iter([]))  # the example's own end of data passes through
    short = et.StepClock(warmup=0, window=2, windows=2)
    short.install(type("P", (_Pipeline,), {}))
    with pytest.raises(RuntimeError, match="trained 0 steps, fewer than the 4 timed"):
        short.rates(1)


def test_example_flags_are_read_as_argparse_would():
    args = ["--batch_size", "512", "--embedding_dim=16", "--batch_size=1024"]
    assert et.option(args, "--batch_size") == "1024" and et.option(args, "--embedding_dim") == "16"
    assert et.option(args, "--limit_train_batches") is None


FAKE_EXAMPLE = """
import sys
import torch.distributed as dist
from torchrec.distributed import TrainPipelineSparseDist  # as the example imports it
import sibling  # the example's own modules (data, lr_scheduler, ...) sit beside it

args = sys.argv[1:]
limit = int(args[args.index("--limit_train_batches") + 1])
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
pipeline = TrainPipelineSparseDist()
it = iter(range(limit))
while True:
    try:
        pipeline.progress(it)
    except StopIteration:
        break
pipeline._model.training = False
pipeline.progress(iter([0]))  # its evaluation
print("fake example ran", sibling.NAME, args)
"""


def test_the_timer_runs_the_script_as_is_and_reports_as_dlrm_bench(tmp_path, monkeypatch, capsys):
    import torch.distributed as dist
    import torchrec.distributed

    checkout = tmp_path / "dlrm" / "torchrec_dlrm"
    checkout.mkdir(parents=True)
    (checkout / "dlrm_main.py").write_text(textwrap.dedent(FAKE_EXAMPLE).replace("{store}", str(tmp_path / "store")))
    (checkout / "sibling.py").write_text("NAME = 'beside'\n")

    class Pipeline(_Pipeline):
        def progress(self, it):
            out = next(it)
            end = time.process_time() + 0.03  # a step of CPU work (CPU time is counted in 10 ms ticks)
            while time.process_time() < end:
                pass
            return out

    monkeypatch.setattr(torchrec.distributed, "TrainPipelineSparseDist", Pipeline)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "sibling", raising=False)
    out = tmp_path / "example.json"
    try:
        et.main(["--example", str(tmp_path / "dlrm"), "--warmup", "1", "--window", "2", "--windows", "3",
                 "--out", str(out), "--", "--batch_size", "64", "--embedding_dim", "16"])  # fmt: skip
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    printed = capsys.readouterr().out
    assert "fake example ran beside ['--batch_size', '64', '--embedding_dim', '16', '--limit_train_batches', '7']" in (
        printed
    )
    result = json.loads(out.read_text())
    assert result["world_size"] == 1 and result["global_batch_size"] == 64 and result["eval_auc"] is None
    assert len(result["samples_per_s_windows"]) == 3 and result["samples_per_s_median"] > 0
    assert result["samples_per_cpu_s"] > 0 and len(result["peak_rss_mb_per_rank"]) == 1
    assert set(ae.figures(result)) == {"samples_per_s", "samples_per_cpu_s", "peak_rss_mb", "eval_auc"}


@pytest.mark.parametrize("flag", ["--limit_train_batches", "--epochs"])
def test_the_timer_sets_the_steps_itself(flag, example, capsys):
    with pytest.raises(SystemExit) as e:
        et.main(["--example", str(example), "--", flag, "5"])
    assert e.value.code == 2 and f"{flag} is set here" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.long
@needs_example
def test_the_real_example_runs_on_two_gloo_ranks_and_reports(tmp_path):
    out = tmp_path / "example.json"
    cmd, env = ae.command("example", ["--warmup", "1", "--window", "2", "--windows", "2"], out, 0,
                          et.find_script(EXAMPLE_CHECKOUT))  # fmt: skip
    # a smaller job than EXAMPLE_ARGS': the example's flags given last win
    cmd += ["--num_embeddings", "1000", "--batch_size", "128", "--limit_val_batches", "1", "--limit_test_batches", "1"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["global_batch_size"] == 256 and result["device"] == "cpu"
    assert len(result["samples_per_s_windows"]) == 2 and result["samples_per_s_median"] > 0
    assert result["samples_per_cpu_s"] > 0 and len(result["peak_rss_mb_per_rank"]) == 2


def test_short_is_two_rounds_of_fp32_and_bf16_with_short_windows_and_a_guard_line(monkeypatch, capsys, example):
    seen: list[tuple[str, tuple]] = []

    def run_once(name, timing, cache_batches, timeout_s, example):
        seen.append((name, tuple(timing)))
        speed = {"example": 100.0, "fp32": 140.0, "bf16": 200.0}[name]
        rss = {"example": 500.0, "fp32": 540.0, "bf16": 520.0}[name]
        return {"samples_per_s_median": speed, "samples_per_cpu_s": speed, "peak_rss_mb_per_rank": [rss]}

    monkeypatch.setattr(ae, "run_once", run_once)
    ae.main(["--example", str(example), "--short", "--windows", "4"])  # what is given wins
    assert [name for name, _ in seen] == ["example", "fp32", "bf16", "bf16", "fp32", "example"]
    assert {timing for _, timing in seen} == {("--warmup", "10", "--window", "10", "--windows", "4")}
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "guard, to TorchRec's example: fp32 samples per s 1.40x (>= 1.3 met); bf16 samples per s 2.00x; "
        "fp32 peak rss mb 1.08x (<= 1.05 MISSED)"
    )
