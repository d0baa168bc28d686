"""The code stays easy to live in: no import circles (a lower layer never imports a module that imports
it back), no file in distfl/ past what one reading holds, every link in the README and docs/ resolves,
and every test file sits in tests/unit, tests/methods or tests/integration."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "distfl"
MAX_LINES = 650


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every distfl module `name` imports, at any depth of its code (function-level and TYPE_CHECKING
    imports count: a circle through them still ties the two modules together)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                out.add(candidate if candidate in modules else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in modules and m != name}


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            current = todo.pop()
            if current == goal:
                return True
            if current not in seen:
                seen.add(current)
                todo.extend(graph[current])
        return False

    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a]
                      if not a.startswith(b + ".") and not b.startswith(a + ".") and reaches(b, a)})
    assert not circles, f"import circles: {circles}"


def test_the_checker_finds_a_circle(tmp_path, monkeypatch):
    """The import walk itself: two modules importing each other inside functions are found."""
    package = tmp_path / "distfl"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("def f():\n    from .b import g\n")
    (package / "sub" / "b.py").write_text("from ..sub import a\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    modules = _modules()
    assert _imports("distfl.sub.a", modules["distfl.sub.a"], modules) == {"distfl.sub.b"}
    assert _imports("distfl.sub.b", modules["distfl.sub.b"], modules) == {"distfl.sub.a"}


def test_no_file_in_distfl_is_longer_than_one_reading():
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these along their seams (at most {MAX_LINES} lines): {long}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_every_test_file_sits_in_unit_methods_or_integration():
    """tests/unit: no run end to end; tests/methods: one method (or the method interface) each, by its
    hooks and by runs; tests/integration: runs as a user starts them (1 and 2 ranks, resume, faults, CLI).
    All share tests/conftest.py."""
    stray = sorted(p.name for p in (REPO / "tests").glob("test_*.py"))
    assert not stray, f"move {', '.join(stray)} into tests/unit, tests/methods or tests/integration (git mv)"
    assert not list((REPO / "tests").glob("*/conftest.py")), "one shared fixture file: tests/conftest.py"
