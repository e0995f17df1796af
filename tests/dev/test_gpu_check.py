"""The GPU acceptance check's dry run on CPU (python dev/gpu_check --device cpu --quick: every step's real
process, tiny sizes), its sizing of the tables to the card, its report and budget, its probes' mechanics
on CPU; and the bundle that carries it to a bare GPU machine (dev/gpu_bundle.py pack/carry,
dev/gpu_install.sh) on small dummy files."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT

DEV = ROOT / "dev"
sys.path.insert(0, str(ROOT))  # the check's package, dev.gpu_check, as `python dev/gpu_check` imports it

from dev.gpu_check import environment, sizing  # noqa: E402
from dev.gpu_check.__main__ import parse_args  # noqa: E402
from dev.gpu_check.check import Check  # noqa: E402

H100_MIB, H200_MIB = 81559, 143771  # nvidia-smi's memory.total of an H100 SXM 80GB and an H200 141GB
ON_CPU = ["train", "throughput", "fp16", "bf16_tables", "resume", "eval_only_reshard", "full_tables"]
GPU_ONLY = {"bf16_qcomms", "bf16_probe", "uvm_caching"}


def run_check(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DEV / "gpu_check"), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    r = run_check("--device", "cpu", "--quick", "--out", str(out))
    return r, out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.long  # the dry run: ~40-100 s of 7 processes in turn (bash launch/test.sh -m long)
def test_dry_run_every_step_passes(dry_run):
    r, out, report = dry_run
    assert r.returncode == 0, r.stdout + r.stderr
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ON_CPU
    for name, s in steps.items():
        assert s["status"] == "passed" and s["passed"] is True, (name, s.get("reason"), s.get("console_tail"))
        assert s["wall_s"] > 0 and "topology=cpu" in s["command"] and Path(s["log"]).parent == out
        assert f"[gpu_check] {name}: passed" in r.stdout  # one progress line per step
    assert {n["name"] for n in report["not_available"]} == GPU_ONLY
    assert report["verdict"]["passed"] is True and report["verdict"]["summary"].startswith("PASS")
    assert report["device"] == "cpu" and report["quick"] is True and report["finished"]
    assert report["gpus"] is None and report["stack"]["versions"]["torch"]  # no card here; the versions named


@pytest.mark.slow
@pytest.mark.long  # the dry run: ~40-100 s of 7 processes in turn (bash launch/test.sh -m long)
def test_dry_run_figures(dry_run):
    _, _, report = dry_run
    steps = {s["name"]: s for s in report["steps"]}
    train = steps["train"]["figures"]
    assert train["device"] == "cpu" and train["evaluations"] >= 2 and train["train_samples_per_s"] > 0
    assert "trainer.breakdown=false" in steps["train"]["command"] and train["checkpoints"][-1] == "step_00000008"
    speed = steps["throughput"]["measured"]
    assert (
        "experiment=bench_dcnv2" in steps["throughput"]["command"]
        and "trainer.breakdown=false" in steps["throughput"]["command"]
    )
    assert speed["samples_per_s"] > 0 and math.isfinite(speed["final_loss"]) and speed["device_ms_per_step"] is None
    assert steps["fp16"]["figures"]["steps"] == 4 and "sharding.qcomms_backward=fp16" in steps["fp16"]["command"]
    refusal = steps["bf16_tables"]
    assert refusal["exit_code"] == 2 and refusal["refusal"].startswith("error: config key 'model.embedding_precision'")
    resume = steps["resume"]
    assert resume["resumed_line"].startswith("resumed from ") and resume["start_event"]["resumed"] is True
    reshard = steps["eval_only_reshard"]
    assert reshard["figures"]["sharding_types"] == ["row_wise"] and reshard["same_eval_data"] is True
    assert math.isclose(reshard["figures"]["eval_auc"], train["eval_auc"], rel_tol=1e-5)
    full = steps["full_tables"]
    assert full["row_cap"] == sizing.QUICK_TABLE_ROWS and "model.tables.0.rows=1000" in full["command"]
    assert full["figures"]["mean_step_s"] > 0 and full["figures"]["peak_rss_mb"] > 0


def test_the_steps_a_first_gpu_user_needs_come_first_and_fit_the_budget():
    """On a GPU every step's limit fits the default budget together (none is skipped for another's
    overrun); every step of ORDER has its function."""
    from dev.gpu_check import features, lifecycle

    assert sizing.ORDER[:2] == ("train", "throughput") and sizing.ORDER[-1] == "full_tables"
    assert set(sizing.ORDER) == set(lifecycle.STEPS) | set(features.STEPS)
    assert tuple(sizing.FULL.timeout_s) == sizing.ORDER and set(sizing.QUICK.timeout_s) == set(sizing.ORDER)
    assert sum(sizing.FULL.timeout_s.values()) <= parse_args([]).budget_s


@pytest.mark.parametrize("card_mib", [H100_MIB, H200_MIB])
def test_full_tables_fit_the_card_the_planner_is_told_about(tmp_path, card_mib):
    """The planner and the memory check see the card's own memory (an H100 is not an H200: 141 GB on
    an 80 GB card placed 104.5 GB of tables there), and the MLPerf DCNv2 tables are capped to TABLE_SHARE
    of it: the 40M-row tables first, the small ones whole."""
    check = Check(parse_args(["--device", "cuda", "--out", str(tmp_path)]))
    check.card_mib = card_mib
    card_gb = card_mib * 2**20 / 1e9
    assert f"topology.hbm_GB={card_gb:.1f}" in check.topology() and "topology.ranks_per_node=1" in check.topology()
    got_gb, cap = sizing.card_tables(card_mib)
    tables = sizing.table_rows()
    assert got_gb == card_gb and sizing.table_bytes(tables) / 1e9 == pytest.approx(105.5, abs=0.5)
    capped = [(min(r, cap), d) for r, d in tables]
    assert sizing.table_bytes(capped) <= sizing.TABLE_SHARE * card_mib * 2**20
    assert sizing.table_bytes([(min(r, cap + 1), d) for r, d in tables]) > sizing.TABLE_SHARE * card_mib * 2**20
    assert all(rows <= cap for rows, _ in tables if rows < 1_000_000)  # only the big tables are capped
    overrides = sizing.cap_overrides(tables, cap)
    assert overrides == [f"model.tables.{i}.rows={cap}" for i, (r, _) in enumerate(tables) if r > cap]
    assert sizing.card_tables(400_000)[1] is None  # a card that holds them whole: no cap


def test_the_stack_is_named_against_cis_pins():
    stack = environment.stack()
    assert stack["ci_pins"] == {"torch": "2.13.0", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    assert stack["is_ci_stack"] is True  # this venv: torch 2.13, torchrec 1.8, fbgemm-gpu-cpu 1.8
    assert environment.parse_gpu("NVIDIA H100 80GB HBM3, 81559, 570.86.15") == {
        "name": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "driver": "570.86.15",
    }


def test_no_step_starts_past_the_budget(tmp_path):
    """A budget too short for any step: every step is recorded as skipped, the report is still complete."""
    r = run_check("--device", "cpu", "--budget-s", "1", "--out", str(tmp_path), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [s["name"] for s in report["steps"]] == ON_CPU and {s["status"] for s in report["steps"]} == {"skipped"}
    assert "budget" in report["steps"][0]["reason"] and "train did not pass" in report["steps"][4]["reason"]
    assert {n["name"] for n in report["not_available"]} == GPU_ONLY
    assert report["verdict"]["passed"] is False and report["verdict"]["summary"].startswith("FAIL")
    assert not list(tmp_path.glob(".report.json.*"))  # the temporary file was renamed, not left behind


@pytest.mark.slow
def test_the_uvm_probe_sees_every_evaluation_and_no_locked_line(tmp_path, capsys):
    """The uvm probe's mechanics on CPU (its cache is a GPU's: here no table is cached, so no hit rate): the
    Trainer's evaluations are seen where the run makes them, each followed by a count of locked lines.
    The probe's main runs in this process (one rank, as the check starts it)."""
    from dev.gpu_check import probes

    out = tmp_path / "uvm.json"
    argv = ["uvm", "--out", str(out), "--steps", "6", "model=tiny", "data.global_batch_size=32", "data.eval_batches=2"]
    assert probes.main(argv) == 0, capsys.readouterr().err
    m = json.loads(out.read_text())
    assert m["steps"] == 6 and m["cached_tables_kernels"] == 0 and m["plan_kernels"] == ["fused"]
    assert [e["step"] for e in m["evaluations"]] == [3, 6] and {e["locked_lines_after"] for e in m["evaluations"]} == {
        0
    }
    assert all(e["training_before"]["hit_rate"] is None for e in m["evaluations"])


# --- the bundle ------------------------------------------------------------------------------------


def dummy_wheel(path: Path) -> None:
    """A minimal pure-Python wheel `gcdummy` (one module), as pip expects it."""
    files = {"gcdummy.py": b"VALUE = 42\n"}
    dist = "gcdummy-0.1.dist-info"
    files[f"{dist}/METADATA"] = b"Metadata-Version: 2.1\nName: gcdummy\nVersion: 0.1\n"
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def staged(tmp_path: Path) -> tuple[Path, Path]:
    """A staging directory (a dummy wheel, incompressible bytes: several parts) and a source tree whose
    dev/gpu_check reports its arguments and that it imports the installed wheel."""
    stage, src = tmp_path / "stage", tmp_path / "src"
    (stage / "wheels").mkdir(parents=True)
    (stage / "blob.bin").write_bytes(os.urandom(6000))
    dummy_wheel(stage / "wheels" / "gcdummy-0.1-py3-none-any.whl")
    (src / "dev" / "gpu_check").mkdir(parents=True)
    (src / "dev" / "gpu_check" / "__main__.py").write_text(
        "import sys, gcdummy\nprint('CHECK', gcdummy.VALUE, sys.argv[1:])\n"
    )
    return stage, src


def bundle(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DEV / "gpu_bundle.py"), *args], capture_output=True, text=True, timeout=60
    )


def install(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = sys.executable
    return subprocess.run(
        ["bash", str(DEV / "gpu_install.sh"), *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_bundle_splits_verifies_reassembles_and_runs(tmp_path):
    (stage, src), out, dest = staged(tmp_path), tmp_path / "out", tmp_path / "dest"
    r = bundle("pack", str(stage), "--out", str(out), "--part-bytes", "2000", "--src", str(src))
    assert r.returncode == 0, r.stderr
    parts = sorted(out.glob("bundle.tar.xz.part*"))
    assert len(parts) >= 3 and all(p.stat().st_size <= 2000 for p in parts)
    assert all(p.stat().st_size == 2000 for p in parts[:-1])  # cut in order: only the last is short
    manifest = [line.split() for line in (out / "MANIFEST.sha256").read_text().splitlines()]
    assert [name for _, name in manifest] == [p.name for p in parts]
    assert all(hashlib.sha256(p.read_bytes()).hexdigest() == s for (s, _), p in zip(manifest, parts, strict=True))
    whole = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()
    assert (out / "bundle.tar.xz.sha256").read_text().split()[0] == whole
    assert (out / "install.sh").read_text() == (DEV / "gpu_install.sh").read_text()

    r = install("--bundle", str(out), "--dest", str(dest), "--", "--budget-s", "9")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (dest / "blob.bin").read_bytes() == (stage / "blob.bin").read_bytes()
    main = Path("dev") / "gpu_check" / "__main__.py"
    assert (dest / "src" / main).read_text() == (src / main).read_text()
    assert (dest / "site" / "gcdummy.py").is_file()  # installed with pip --no-index into DEST/site
    assert "CHECK 42 ['--budget-s', '9']" in r.stdout  # the check ran with the wheels on its path
    assert not (dest / "bundle.tar.xz").exists()

    r = bundle("carry", "1", "--out", str(out), "--to", str(tmp_path / "carry"))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == sorted(
        [parts[1].name, "MANIFEST.sha256", "bundle.tar.xz.sha256", "src.tar.xz", "src.tar.xz.sha256"]
    )
    assert bundle("carry", str(len(parts)), "--out", str(out), "--to", str(tmp_path / "c2")).returncode != 0
    r = bundle("carry", "all", "--out", str(out), "--to", str(tmp_path / "carry"))  # emptied, then refilled
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "carry").glob("*.part*")) == [p.name for p in parts]


def test_bundle_refuses_corrupt_or_missing_parts(tmp_path):
    (stage, src), out, dest = staged(tmp_path), tmp_path / "out", tmp_path / "dest"
    assert bundle("pack", str(stage), "--out", str(out), "--part-bytes", "2000", "--src", str(src)).returncode == 0
    (out / "src.tar.xz").write_bytes((out / "src.tar.xz").read_bytes() + b"x")
    r = install("--bundle", str(out), "--dest", str(dest), "--no-install")
    assert r.returncode == 1 and "src.tar.xz does not match" in r.stderr
    part = out / "bundle.tar.xz.part01"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    r = install("--bundle", str(out), "--dest", str(dest), "--no-install")
    assert r.returncode == 1 and "bundle.tar.xz.part01" in r.stderr and "do not match" in r.stderr
    assert not (dest / "src").exists()
    part.unlink()
    r = install("--bundle", str(out), "--dest", str(dest), "--no-install")
    assert r.returncode == 1 and "missing" in r.stderr and "bundle.tar.xz.part01" in r.stderr
    r = install("--bundle", str(tmp_path / "nowhere"), "--dest", str(dest))
    assert r.returncode == 2 and "MANIFEST.sha256" in r.stderr
