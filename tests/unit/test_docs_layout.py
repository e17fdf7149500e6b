"""docs/layout.md names every part of the package, and only paths that exist.

Every module of `provisioner/` (but `__init__.py`), every package and every package-data
file must be mentioned as a path in backquotes (`provisioner/decide/plan.py`,
`provisioner/sites/`); every repository path the page mentions so must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs" / "layout.md"
#: Not part of the source tree: bytecode, and the data a wheel build copies in.
SKIPPED_DIRS = frozenset({"__pycache__", "_data"})
#: A repository path in backquotes: relative, with at least one slash, no spaces.
PATH_TOKEN = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?)`")


def package_parts(root: Path = ROOT) -> list[str]:
    """Every module (not __init__.py), package and package-data file under provisioner/,
    as repository paths; a package ends with a slash."""
    parts: list[str] = []
    for path in sorted((root / "provisioner").rglob("*")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_dir():
            if (path / "__init__.py").exists() or any(
                    p.is_file() for p in path.iterdir() if p.suffix != ".pyc"):
                parts.append(f"{rel.as_posix()}/")
        elif path.name != "__init__.py":
            parts.append(rel.as_posix())
    return parts


def mentioned_paths(text: str) -> set[str]:
    """The repository paths a page names in backquotes."""
    return {m for m in PATH_TOKEN.findall(text) if "/" in m}


def test_layout_names_every_module_package_and_data_file() -> None:
    mentioned = {p.rstrip("/") for p in mentioned_paths(LAYOUT.read_text(encoding="utf-8"))}
    missing = [p for p in package_parts() if p.rstrip("/") not in mentioned]
    assert not missing, (
        "docs/layout.md does not mention (add a line saying what each does): "
        + ", ".join(missing))


def test_layout_names_only_paths_that_exist() -> None:
    absent = sorted(p for p in mentioned_paths(LAYOUT.read_text(encoding="utf-8"))
                    if not (ROOT / p).exists())
    assert not absent, "docs/layout.md names paths that do not exist: " + ", ".join(absent)


def test_the_walk_finds_modules_packages_and_data_files() -> None:
    parts = package_parts()
    assert "provisioner/decide/plan.py" in parts
    assert "provisioner/sites/" in parts
    assert not any(p.endswith("__init__.py") for p in parts)
    assert any(p.startswith("provisioner/pilot/files/") and p.endswith(".sh") for p in parts)


def test_a_missing_line_and_a_wrong_path_are_named(tmp_path: Path) -> None:
    (tmp_path / "provisioner" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (tmp_path / "provisioner" / name).write_text("")
    assert package_parts(tmp_path) == [
        "provisioner/a.py", "provisioner/sub/", "provisioner/sub/b.py"]
    page = "- `provisioner/a.py`: one\n- `provisioner/sub/`: `provisioner/gone.py`, `make x`"
    assert mentioned_paths(page) == {"provisioner/a.py", "provisioner/sub/",
                                     "provisioner/gone.py"}
