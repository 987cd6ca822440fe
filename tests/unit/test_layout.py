"""The house rules of the code layout (docs/architecture.md, "Floors"), checked from the source itself.

- Only `asyncrl` goes into site-packages: the wheel's one top-level package, with every package folder of
  the repository inside it.
- Floors: core (asyncrl.core, asyncrl.v1, and asyncrl.push: the weight push, the one feature every role
  takes part in, in one room) <- roles (controller, rollout, teacher, learner) <- services <-
  roof (asyncrl.tools, asyncrl.__main__, bench/). A module imports only its own floor or lower ones; a role never imports
  another role; nothing imports the roof. Imports inside functions count: they run too.
- No import cycles between modules, nor between folders (rooms): no two folders import each other, directly
  or round a loop.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]

CORE, ROLE, SERVICE, ROOF = 0, 1, 2, 3
FLOOR_NAMES = {CORE: "core", ROLE: "role", SERVICE: "services", ROOF: "roof"}
ROLES = ("asyncrl.controller", "asyncrl.rollout", "asyncrl.teacher", "asyncrl.learner")


def floor_of(module: str) -> int:
    if module == "asyncrl" or module.startswith(("asyncrl.core", "asyncrl.v1", "asyncrl.push")):
        return CORE
    if module.startswith(ROLES):
        return ROLE
    if module.startswith("asyncrl.services"):
        return SERVICE
    if module.startswith(("asyncrl.tools", "bench")) or module == "asyncrl.__main__":
        return ROOF
    raise AssertionError(f"{module}: no floor; add it to docs/architecture.md and to this test")


def role_of(module: str) -> str | None:
    return next((role for role in ROLES if module == role or module.startswith(role + ".")), None)


def project_modules() -> dict[str, Path]:
    """Module name -> source file for every module of the package (through the package-dir table) and bench/."""
    modules: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            # A nested mapped folder (asyncrl/ holds no mapped folder) is found under its own mapping.
            name = ".".join([package, *parts])
            if package == "asyncrl" and parts and f"asyncrl.{parts[0]}" in PACKAGE_DIRS:
                continue
            modules[name] = path
    for path in sorted((ROOT / "bench").glob("*.py")):
        modules[f"bench.{path.stem}"] = path
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that `name` imports anywhere in its file (`from a import b` names a.b when b is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            # The longest known module the dotted name starts with (import a.b.c names module a.b.c or a.b).
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def test_every_package_folder_is_listed_for_the_wheel():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in project_modules().items() if path.name == "__init__.py"}
    assert on_disk == listed, f"missing from pyproject: {on_disk - listed}; listed but absent: {listed - on_disk}"


def test_imports_point_down_only(graph):
    wrong = []
    for module, targets in graph.items():
        for target in targets:
            up = floor_of(target) > floor_of(module)
            sideways = role_of(module) and role_of(target) and role_of(module) != role_of(target)
            if up or sideways:
                wrong.append(
                    f"{module} ({FLOOR_NAMES[floor_of(module)]}) -> {target} ({FLOOR_NAMES[floor_of(target)]})"
                )
    assert not wrong, "imports that point up or across roles:\n" + "\n".join(sorted(wrong))


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph`; every component of more than one node is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def room_of(module: str, modules: dict[str, Path]) -> str:
    """The folder a module lives in (a package is its own folder's door)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_import_cycles(graph):
    cycles = cycles_of(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_no_two_folders_import_each_other(graph):
    modules = project_modules()
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = room_of(module, modules)
        rooms.setdefault(here, set()).update(room_of(t, modules) for t in targets if room_of(t, modules) != here)
    cycles = cycles_of(rooms)
    assert not cycles, f"folders that import each other: {cycles}"


def test_the_checker_sees_a_violation(tmp_path):
    # The checks above must be able to fail: an upward import and a cycle in a made-up module set.
    (tmp_path / "a.py").write_text("from asyncrl.services import x\nimport asyncrl.core.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from asyncrl.core.a import y\n")
    known = {"asyncrl.core.a", "asyncrl.core.b", "asyncrl.services"}
    assert imports_of("asyncrl.core.a", tmp_path / "a.py", known) == {"asyncrl.services", "asyncrl.core.b"}
    assert imports_of("asyncrl.core.b", tmp_path / "b.py", known) == {"asyncrl.core.a"}
    assert floor_of("asyncrl.services") > floor_of("asyncrl.core.a")


def test_the_wheel_installs_only_asyncrl(tmp_path):
    # Built from a copy: setuptools leaves a build/ folder in the source tree, and a stale one would carry
    # deleted modules into later wheels.
    source, out = tmp_path / "source", tmp_path / "wheel"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in set(PACKAGE_DIRS.values()):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = out.glob("asyncrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"asyncrl"}
    packages = {name.rpartition("/")[0].replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packages == set(PYPROJECT["tool"]["setuptools"]["packages"])
