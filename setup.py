"""The build's one step that pyproject.toml cannot state: the installed package carries the
known-deviations file (it sits at the repository's top, outside suite/; suite/layout.py finds it
in either place)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class BuildPy(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install reads the repository's file
            target = Path(self.build_lib) / "tf_distribute_suite" / "known_deviations.toml"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / "known_deviations.toml", target)


setup(cmdclass={"build_py": BuildPy})
