"""Every field of every config dataclass (dlrm/config/) has its doc beside it: an attribute docstring,
the string literal right after the field. A string that follows anything else is a stale doc."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import dlrm.config

PACKAGE = Path(dlrm.config.__file__).parent
MAX_LINES = 400


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
            isinstance(target, ast.Attribute) and target.attr == "dataclass"
        ):
            return True
    return False


def _is_doc(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def field_docs(source: str) -> tuple[dict[str, dict[str, str | None]], list[str]]:
    """({dataclass: {field: its attribute docstring, or None}}, [stale docs: strings in a dataclass's
    body that follow no field, by class and line])."""
    classes: dict[str, dict[str, str | None]] = {}
    stale: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or not _is_dataclass(node):
            continue
        fields: dict[str, str | None] = {}
        body = node.body[1:] if node.body and _is_doc(node.body[0]) else node.body  # the class docstring
        previous: ast.stmt | None = None
        for stmt in body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields[stmt.target.id] = None
            elif _is_doc(stmt):
                if isinstance(previous, ast.AnnAssign) and isinstance(previous.target, ast.Name):
                    fields[previous.target.id] = ast.literal_eval(stmt.value).strip()
                else:
                    stale.append(f"{node.name}, line {stmt.lineno}")
            previous = stmt
        classes[node.name] = fields
    return classes, stale


def _package_docs() -> dict[str, dict[str, str | None]]:
    docs: dict[str, dict[str, str | None]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        classes, stale = field_docs(path.read_text())
        assert not stale, f"{path.name}: strings that document no field: {stale}"
        for name, fields in classes.items():
            assert name not in docs, f"two config dataclasses named {name}"
            docs[name] = fields
    return docs


def test_every_config_field_has_its_doc_beside_it():
    missing = [f"{cls}.{name}" for cls, fields in _package_docs().items() for name, doc in fields.items() if not doc]
    assert not missing, f"fields without an attribute docstring: {missing}"


def test_the_documented_fields_are_the_dataclasses_fields():
    """The fields parsed from the source are those the dataclasses have, for every config dataclass
    the package exports: no doc describes a field that does not exist, no dataclass is missed."""
    docs = _package_docs()
    exported = {
        name: obj
        for name, obj in vars(dlrm.config).items()
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__.startswith("dlrm.config")
    }
    assert set(exported) == set(docs)
    for name, cls in exported.items():
        assert [f.name for f in dataclasses.fields(cls)] == list(docs[name]), name


def test_config_modules_are_short():
    long = {p.name: n for p in PACKAGE.glob("*.py") if (n := p.read_text().count("\n")) > MAX_LINES}
    assert not long, f"split these modules (at most {MAX_LINES} lines): {long}"


def test_the_check_sees_a_missing_and_a_stale_doc():
    source = '''
@dataclass
class A:
    """Summary."""

    x: int = 1
    """The x."""
    y: int = 2
    z: int = 3
    """The z."""

    def check(self) -> None:
        pass

    """Left behind."""


class NotADataclass:
    w: int = 0
'''
    classes, stale = field_docs(source)
    assert classes == {"A": {"x": "The x.", "y": None, "z": "The z."}}
    assert stale == ["A, line 15"]
