"""Readable units: every module of dlrm/ under 400 lines and every function under 60 (its docstring
not counted), unless a comment says why (`# long: <reason>` on the def line or the line above it;
`# long file: <reason>` in a module's first 20 lines)."""

from __future__ import annotations

import ast

import pytest

from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "dlrm"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def oversized(source: str) -> list[str]:
    """What in `source` is over the limits without a `# long` comment saying why."""
    lines = source.splitlines()
    found = []
    if len(lines) > MAX_FILE_LINES and not any("# long file:" in line for line in lines[:20]):
        found.append(f"{len(lines)} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            first_stmt = node.body[0]
            if isinstance(first_stmt, ast.Expr) and isinstance(first_stmt.value, ast.Constant):
                length -= (first_stmt.end_lineno or first_stmt.lineno) - first_stmt.lineno + 1  # the docstring
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            said = any("# long:" in lines[i - 1] for i in (first - 1, node.lineno) if i >= 1)
            if length > MAX_FUNCTION_LINES and not said:
                found.append(f"{node.name}() {length} lines")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_and_functions_are_short_or_say_why(path):
    assert oversized(path.read_text()) == []


def test_the_check_finds_a_long_function_and_accepts_a_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def f():\n{body}\n") == [f"f() {MAX_FUNCTION_LINES + 1} lines"]
    assert oversized(f"# long: one table of cases\ndef f():\n{body}\n") == []
    docstring = '    """' + "\n".join(["doc"] * 30) + '"""'
    assert oversized(f"def f():\n{docstring}\n" + "\n".join(body.splitlines()[:-1]) + "\n") == []
    assert oversized("x = 1\n" * (MAX_FILE_LINES + 1)) == [f"{MAX_FILE_LINES + 1} lines"]
