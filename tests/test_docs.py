"""The documentation's links and repository paths resolve, and the README stays short."""

import ast
import re
from pathlib import Path

from tests.helpers import REPO_ROOT as ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "design").glob("*.md"))]
README_MAX_LINES = 230

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"[\w.-]+(/[\w.*-]+)*/?")
DOTTED = re.compile(r"dlrm(\.\w+)+")  # a module or a name in one: `dlrm.trainer.profiler.StepProfiler`
# Top-level folders that hold files a fresh clone does not have (runs, data, the virtual environment).
NOT_IN_CLONE = {"outputs", "data", "runs", "build", ".venv"}
# Paths named in backticks that are not in a checkout on purpose.
ELSEWHERE = {"dlrm/conf", "examples/dlrm/dlrm_main.py"}  # conf/ as the wheel carries it; a TorchRec checkout's file


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def _exists(base: Path, rel: str) -> bool:
    rel = rel.rstrip("/")
    if "*" in rel:
        return any(base.glob(rel))
    return (base / rel).exists()


def _repo_path(token: str) -> Path | None:
    """The base a backticked token is a path under, or None when it names no file of the repository:
    paths from the repository root (`dlrm/models/dlrm.py`), and the module table's paths inside `dlrm/`
    (`models/dlrm.py`)."""
    if "/" not in token or not PATHLIKE.fullmatch(token) or token in ELSEWHERE:
        return None
    first = token.split("/", 1)[0]
    if first == "..":  # beside the checkout (the workplace's ../shared/data), not in it
        return None
    if token.endswith(".py") and (ROOT / "dlrm" / first).is_dir():
        return ROOT / "dlrm"
    if first in NOT_IN_CLONE or not (ROOT / first).is_dir():
        return None
    return ROOT


def test_pages_exist():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 2


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(_prose(page)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s), mailto: and anchors within the page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: ({target})")
    assert not broken, "\n".join(broken)


def test_backticked_repo_paths_exist():
    missing = []
    for page in PAGES:
        for token in CODE.findall(_prose(page)):
            base = _repo_path(token)
            if base is not None and not _exists(base, token):
                missing.append(f"{page.relative_to(ROOT)}: `{token}`")
    assert not missing, "\n".join(missing)


def _top_level_names(module: Path) -> set[str]:
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _resolves(dotted: str) -> bool:
    """Whether `dlrm.a.b[.name[.attr]]` names a module of the package, or a top-level name in one
    (read from its source, nothing imported; what follows the name is not checked)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[i:]
            return not rest or rest[0] in _top_level_names(module) or (base / f"{rest[0]}.py").is_file()
    return False


def test_backticked_module_names_resolve():
    stale = []
    for page in PAGES:
        for token in CODE.findall(_prose(page)):
            name = token.removesuffix("()")
            if DOTTED.fullmatch(name) and not name.endswith(".py") and not _resolves(name):
                stale.append(f"{page.relative_to(ROOT)}: `{token}`")
    assert not stale, "\n".join(stale)


def test_the_checks_catch_what_they_should():
    assert _resolves("dlrm.trainer.profiler.StepProfiler") and _resolves("dlrm.common.cadence.Every")
    assert not _resolves("dlrm.core.profiling.StepProfiler") and not _resolves("dlrm.trainer.profiler.Nothing")
    assert _repo_path("dlrm/core/nothing.py") == ROOT and not _exists(ROOT, "dlrm/core/nothing.py")
    assert _repo_path("models/dlrm.py") == ROOT / "dlrm" and _exists(ROOT / "dlrm", "models/dlrm.py")
    assert _repo_path("data/loader.py") == ROOT / "dlrm" and not _exists(ROOT / "dlrm", "data/nothing.py")
    assert _exists(ROOT, "launch/env/*.sh") and not _exists(ROOT, "launch/env/*.nothing")
    for not_a_repo_path in ("outputs/run1/checkpoints", "data/criteo_kaggle", "summary.json", "<run dir>/.lock"):
        assert _repo_path(not_a_repo_path) is None, not_a_repo_path
    assert LINK.findall("[a](../launch/README.md#x) and [b](https://example.com)") == [
        "../launch/README.md#x",
        "https://example.com",
    ]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
