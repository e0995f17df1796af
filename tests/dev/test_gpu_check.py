"""The GPU acceptance check's dry run on CPU (dev/gpu_check.py --device cpu --quick: the real
`python -m dlrm.train` in every step, tiny sizes) and the bundle that carries it to a bare GPU machine
(dev/gpu_bundle.py pack/carry, dev/gpu_install.sh) on small dummy files."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
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


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    r = subprocess.run(
        [sys.executable, str(ROOT / "dev/gpu_check.py"), "--device", "cpu", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out, json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.long  # the dry run: ~60 s of 4 trainings in turn (bash launch/test.sh -m long)
def test_dry_run_every_step_passes(dry_run):
    r, out, report = dry_run
    assert r.returncode == 0, r.stdout + r.stderr
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ["train", "resume", "eval_only_reshard", "big_tables"]
    for name, s in steps.items():
        assert s["status"] == "passed" and s["passed"] is True, (name, s.get("reason"), s.get("console_tail"))
        assert s["exit_code"] == 0 and s["wall_s"] > 0 and s["command"][1:3] == ["-m", "dlrm.train"]
        assert "topology=cpu" in s["command"]
        assert Path(s["log"]).is_file() and Path(s["log"]).parent == out
        assert f"[gpu_check] {name}: passed" in r.stdout  # one progress line per step
    assert report["verdict"]["passed"] is True and report["verdict"]["summary"].startswith("PASS")
    assert report["device"] == "cpu" and report["quick"] is True and report["finished"]


@pytest.mark.slow
@pytest.mark.long  # the dry run: ~60 s of 4 trainings in turn (bash launch/test.sh -m long)
def test_dry_run_train_resume_and_reshard(dry_run):
    _, _, report = dry_run
    steps = {s["name"]: s for s in report["steps"]}
    train = steps["train"]["figures"]
    assert train["device"] == "cpu" and train["breakdown_profiled_steps"] >= 1 and train["breakdown_phase_s"]
    assert train["evaluations"] >= 2 and train["log_records"] >= 2 and train["train_samples_per_s"] > 0
    assert "trainer.breakdown=true" in steps["train"]["command"]
    assert train["checkpoints"][-1] == f"step_{train['steps']:08d}"
    resume = steps["resume"]
    assert resume["resumed_line"].startswith("resumed from ") and f"at step {train['steps']}" in resume["resumed_line"]
    assert resume["start_event"]["resumed"] is True and resume["figures"]["steps"] > train["steps"]
    reshard = steps["eval_only_reshard"]
    assert reshard["figures"]["sharding_types"] == ["row_wise"] and reshard["train_sharding_types"] != ["row_wise"]
    assert reshard["same_eval_data"] is True
    assert math.isclose(reshard["figures"]["eval_auc"], train["eval_auc"], rel_tol=1e-5)
    assert math.isclose(reshard["figures"]["eval_logloss"], train["eval_logloss"], rel_tol=1e-5)


@pytest.mark.slow
@pytest.mark.long  # the dry run: ~60 s of 4 trainings in turn (bash launch/test.sh -m long)
def test_dry_run_big_tables_and_not_available(dry_run):
    _, _, report = dry_run
    big = next(s for s in report["steps"] if s["name"] == "big_tables")
    assert "model=mlperf_dcnv2" in big["command"] and "optim=rowwise_adagrad" in big["command"]
    assert big["tables_capped"] > 0 and any(a.startswith("model.tables.0.rows=") for a in big["command"])
    assert big["figures"]["mean_step_s"] > 0 and big["figures"]["peak_rss_mb"] > 0
    names = {n["name"]: n for n in report["not_available"]}
    assert set(names) == {"uvm_caching", "per_step_sync_on_off"}
    assert all(n["reason"].startswith(("not available", "not run")) for n in names.values())
    assert names["per_step_sync_on_off"]["train_samples_per_s"] > 0
    assert set(report["verdict"]["not_available"]) == set(names)


def test_the_steps_a_first_gpu_user_needs_come_first_and_fit_the_budget(monkeypatch):
    """On a GPU every step's limit fits the default budget together (none is skipped for another's
    overrun), in ORDER: training and its per-step wait, UVM caching, resume and eval-only, big tables."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "dev/gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    assert gpu_check.ORDER[:3] == ("train", "per_step_sync", "uvm_caching") and gpu_check.ORDER[-1] == "big_tables"
    for sizes in (gpu_check.FULL, gpu_check.QUICK):
        assert tuple(sizes.timeout_s) == gpu_check.ORDER
    default_budget = gpu_check.parse_args([]).budget_s
    assert sum(gpu_check.FULL.timeout_s.values()) <= default_budget
    source = (ROOT / "dev/gpu_check.py").read_text()
    calls = [source.index(f"self.{m}(", source.index("def run(self)")) for m in
             ("train", "per_step_sync", "uvm_caching", "resume", "eval_only", "big_tables")]  # fmt: skip
    assert calls == sorted(calls)


def test_no_step_starts_past_the_budget(tmp_path):
    """A budget too short for any step: every step is recorded as skipped, the report is still complete."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "dev/gpu_check.py"), "--device", "cpu", "--budget-s", "1", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [s["status"] for s in report["steps"]] == ["skipped"] * 4
    assert "budget" in report["steps"][0]["reason"] and "train did not pass" in report["steps"][1]["reason"]
    assert report["verdict"]["passed"] is False and report["verdict"]["summary"].startswith("FAIL")
    assert not list(tmp_path.glob(".report.json.*"))  # the temporary file was renamed, not left behind


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
    dev/gpu_check.py reports its arguments and that it imports the installed wheel."""
    stage, src = tmp_path / "stage", tmp_path / "src"
    (stage / "wheels").mkdir(parents=True)
    (stage / "blob.bin").write_bytes(os.urandom(6000))
    dummy_wheel(stage / "wheels" / "gcdummy-0.1-py3-none-any.whl")
    (src / "dev").mkdir(parents=True)
    (src / "dev" / "gpu_check.py").write_text("import sys, gcdummy\nprint('CHECK', gcdummy.VALUE, sys.argv[1:])\n")
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
    assert (dest / "src" / "dev" / "gpu_check.py").read_text() == (src / "dev" / "gpu_check.py").read_text()
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
