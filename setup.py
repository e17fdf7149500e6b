"""Build step: the wheel carries the top-level slurm_templates/, condor_config/ and
images/ as package data under provisioner/_data/ (provisioner.onboard.data finds
them there; a source checkout uses the top-level directories themselves). Everything
else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_DIRS = ("slurm_templates", "condor_config", "images")


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout itself
            return
        here = Path(__file__).resolve().parent
        for name in DATA_DIRS:
            dest = Path(self.build_lib) / "provisioner" / "_data" / name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(here / name, dest)


setup(cmdclass={"build_py": BuildWithData})
