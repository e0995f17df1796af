"""The package as pip installs it: every subpackage listed, conf/ inside the wheel and found there."""

import shutil
import subprocess
import sys
import tomllib
import zipfile

from tests.helpers import REPO_ROOT as ROOT


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "dlrm").rglob("__init__.py")}
    assert listed == found | {"dlrm.conf"}


def test_a_plain_install_finds_the_configs(tmp_path):
    """A wheel (not an editable install) carries conf/ as dlrm/conf, and composes from it."""
    src = tmp_path / "src"  # a copy: building writes build/ into the source tree
    for name in ("dlrm", "conf"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("dlrm-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    assert (tmp_path / "site" / "dlrm" / "conf" / "topology" / "zion.yaml").is_file()
    code = (
        "import dlrm.config.compose as c; cfg = c.compose(['topology=zion']); "
        "print(c.CONF_DIR); print(cfg.topology.name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert out == [str(tmp_path / "site" / "dlrm" / "conf"), "zion"]


def test_test_modules_import_only_helpers():
    """Shared test code lives in tests/helpers/; a test module importing another one would run its
    module-level setup (scenario-family jobs, fixtures) where it does not belong."""
    tests = ROOT / "tests"
    offenders = [
        f"{path.relative_to(tests)}: {line.strip()}"
        for path in tests.rglob("test_*.py")
        for line in path.read_text().splitlines()
        if line.lstrip().startswith(("from tests", "import tests"))
        and not line.lstrip().startswith(("from tests.helpers", "import tests.helpers"))
    ]
    assert not offenders, offenders
