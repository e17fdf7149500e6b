"""The tree draws the architecture, and the imports keep to it.

- No import circle among the modules of `provisioner` nor among those of `bench`
  (module-level imports, `if TYPE_CHECKING:` ones included; imports inside a function
  are left out: they run late, on purpose).
- `provisioner/decide/` is pure: none of its modules imports anything that reaches the
  outside world (processes, sockets, files, the clock, HTCondor, SLURM, databases), nor a
  part of `provisioner` outside `decide/` but the shared data (`config`, `model`,
  `errors`). Here imports inside functions count too.
- `provisioner/` keeps its top level to the shared data and the command line; every
  other module sits in the package of its role.

The imports are read with `ast`, so nothing is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Modules whose import means I/O or the clock (the top-level name is compared).
IO_MODULES = frozenset({
    "subprocess", "socket", "ssl", "select", "selectors", "asyncio", "multiprocessing",
    "threading", "signal", "fcntl", "os", "shutil", "pathlib", "tempfile", "glob", "io",
    "sqlite3", "dbm", "shelve", "pickle", "http", "urllib", "ftplib", "smtplib",
    "requests", "paramiko", "time", "datetime", "random",
    "htcondor", "htcondor2", "classad", "classad2", "pyslurm", "spython", "XRootD",
    "prometheus_client", "apscheduler", "jinja2", "yaml", "matplotlib",
})
#: What decide/ may import from the rest of the package: the shared data (the
#: configuration package as a whole; its loading module reads files).
DECIDE_MAY_IMPORT = frozenset({"provisioner.config", "provisioner.model", "provisioner.errors"})
#: The only modules directly in provisioner/ (but __init__.py).
TOP_LEVEL = frozenset({"cli.py", "model.py", "errors.py"})


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    module: str  # the imported module, absolute; for `from X import n`, X.n if a module
    in_function: bool


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of `package` under `root` (a package by its
    __init__.py's name)."""
    names: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> Iterator[Import]:
    """Every import statement of one module, resolved to absolute module names."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]

    def visit(node: ast.AST, in_function: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(path, child.lineno, alias.name, in_function)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    anchor = base[:len(base) - child.level + 1]
                    source = ".".join(anchor + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                for alias in child.names:
                    candidate = f"{source}.{alias.name}"
                    target = candidate if candidate in modules else source
                    yield Import(path, child.lineno, target, in_function)
            yield from visit(child, nested)

    yield from visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at module level."""
    modules = module_names(root, package)
    return {name: {i.module for i in imports_of(name, path, modules)
                   if not i.in_function and i.module in modules and i.module != name}
            for name, path in modules.items()}


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import circle as its modules, the first repeated at the end; None if none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def decide_violations(root: Path = ROOT) -> list[str]:
    """Each import of a provisioner/decide/ module that breaks its purity, named."""
    modules = module_names(root, "provisioner")
    found: list[str] = []
    for name, path in modules.items():
        if not name.startswith("provisioner.decide"):
            continue
        for imp in imports_of(name, path, modules):
            where = f"{path.relative_to(root).as_posix()}:{imp.line} imports {imp.module}"
            top = imp.module.split(".")[0]
            if top in IO_MODULES:
                found.append(f"{where} (I/O or the clock)")
            elif top == "provisioner" and not (
                    imp.module.startswith("provisioner.decide")
                    or imp.module in DECIDE_MAY_IMPORT):
                found.append(f"{where} (outside decide/)")
    return found


def describe_cycle(cycle: list[str]) -> str:
    return "import circle: " + " -> ".join(cycle)


def test_provisioner_has_no_import_circle() -> None:
    cycle = find_cycle(import_graph(ROOT, "provisioner"))
    assert cycle is None, describe_cycle(cycle)


def test_bench_has_no_import_circle() -> None:
    cycle = find_cycle(import_graph(ROOT, "bench"))
    assert cycle is None, describe_cycle(cycle)


def test_provisioner_never_imports_bench_or_tests() -> None:
    modules = module_names(ROOT, "provisioner")
    wrong = [f"{i.path.relative_to(ROOT).as_posix()}:{i.line} imports {i.module}"
             for name, path in modules.items() for i in imports_of(name, path, modules)
             if i.module.split(".")[0] in ("bench", "tests")]
    assert not wrong, "; ".join(wrong)


def test_decide_is_pure() -> None:
    found = decide_violations()
    assert not found, "provisioner/decide/ must do no I/O: " + "; ".join(found)


def test_top_level_holds_only_the_shared_data_and_the_command_line() -> None:
    loose = sorted(p.name for p in (ROOT / "provisioner").glob("*.py")
                   if p.name != "__init__.py" and p.name not in TOP_LEVEL)
    assert not loose, ("put these in the package of their role (docs/layout.md): "
                       + ", ".join(loose))


# --- the checks themselves, on small made-up trees ----------------------------------------

def write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_circle_through_type_checking_and_relative_imports_is_found(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from . import c\n"),
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "def late():\n    from pkg import a\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.d"] == set()  # an import inside a function is not a circle's edge
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_each_impure_import_of_decide_is_named(tmp_path: Path) -> None:
    write(tmp_path, {
        "provisioner/__init__.py": "",
        "provisioner/model.py": "",
        "provisioner/pool/__init__.py": "",
        "provisioner/pool/condor.py": "",
        "provisioner/decide/__init__.py": "",
        "provisioner/decide/plan.py": ("import subprocess\nfrom provisioner import model\n"
                                       "from provisioner.pool import condor\n"
                                       "def f():\n    import htcondor2\n"),
        "provisioner/decide/ok.py": "from . import plan\nfrom provisioner.model import X\n",
    })
    assert decide_violations(tmp_path) == [
        "provisioner/decide/plan.py:1 imports subprocess (I/O or the clock)",
        "provisioner/decide/plan.py:3 imports provisioner.pool.condor (outside decide/)",
        "provisioner/decide/plan.py:5 imports htcondor2 (I/O or the clock)",
    ]
