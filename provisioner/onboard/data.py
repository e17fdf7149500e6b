"""The project's data directories, wherever the package is: installed from the wheel
(package data under provisioner/_data/, put there by setup.py's build step) or run
from a source checkout (the top-level directories beside the package)."""

from __future__ import annotations

from pathlib import Path

#: The top-level directories the wheel carries as package data.
DATA_DIRS = ("slurm_templates", "condor_config", "images")
PACKAGE = Path(__file__).resolve().parents[1]


def data_dir(name: str) -> Path | None:
    """The directory `name` (one of DATA_DIRS): the installed copy, else the
    checkout's; None if neither exists."""
    if name not in DATA_DIRS:
        raise ValueError(f"not a data directory of the project: {name!r}")
    for candidate in (PACKAGE / "_data" / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    return None
