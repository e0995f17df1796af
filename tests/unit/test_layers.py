"""The shape of the package: data flows one way. No import cycle among dlrm's modules (module-level
and function-level imports alike), and the core (models, distributed, optim, trainer, checkpoint,
data) imports neither the analysis tools (comms, plan, cluster) nor the entry points."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dlrm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the dlrm modules it imports anywhere in its body}."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):  # not a parent package
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


CORE = ("dlrm.models", "dlrm.distributed", "dlrm.optim", "dlrm.trainer", "dlrm.checkpoint", "dlrm.data")


def test_the_core_imports_no_tool_and_no_entry_point():
    tools = ("dlrm.comms", "dlrm.plan", "dlrm.train", "dlrm.bench.training", "dlrm.export", "dlrm.predict")
    edges = [
        f"{m} -> {t}" for m, targets in import_graph().items() if _within(m, CORE) for t in targets if _within(t, tools)
    ]
    assert edges == []


def test_the_checks_see_a_cycle_and_a_core_edge():
    """The graph and the cycle finder have teeth."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "dlrm.distributed.sharding" in import_graph()["dlrm.trainer.trainer"]


def test_a_bad_command_line_is_refused_before_torch_is_imported():
    """dlrm.train composes and checks (World included) without torch: the refusal comes in a fraction
    of the seconds torch and TorchRec take to import."""
    code = (
        "import sys, dlrm.train\n"
        "sys.argv = ['dlrm.train', 'model=tiny', 'data.global_batch_size=0']\n"
        "try:\n    dlrm.train.main()\nexcept SystemExit as e:\n    print(e.code)\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.stdout.split("\n")[-3:] == ["2", "[]", ""], r.stdout + r.stderr
    assert "data.global_batch_size" in r.stderr
