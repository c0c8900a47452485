"""Where the project's code and files are, in the one place that knows the two layouts.

In the repository, ``suite/`` and ``reference/`` sit side by side (import names ``suite`` and
``reference``) next to ``known_deviations.toml``. Installed (``pip install tf-distribute-suite``),
they are one package, ``tf_distribute_suite``: ``suite/``'s modules, with ``reference/`` as
``tf_distribute_suite.reference`` and the deviations file inside (setup.py copies it). Every
other module imports its siblings relatively and asks this one for the rest. No TensorFlow here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

NAMES = ("suite", "tf_distribute_suite")  # the package's import name in the repository and installed
PACKAGE = __name__.rpartition(".")[0]  # which of them this copy runs as
PACKAGE_DIR = Path(__file__).resolve().parent
# the folder to put on an engine's PYTHONPATH, and the module an engine runs: by the directory's
# name, so that an editable install (tf_distribute_suite mapped onto suite/) starts ``suite.engine``
IMPORT_ROOT = PACKAGE_DIR.parent
ENGINE_MODULE = f"{PACKAGE_DIR.name}.engine.worker"
FORKSERVER_MODULE = f"{PACKAGE_DIR.name}.engine.forkserver"  # forks engines from one TensorFlow import
# the checkout (None when installed): tox envs, docs and the measured runs live here
REPO_ROOT = IMPORT_ROOT if (IMPORT_ROOT / "pyproject.toml").is_file() and (IMPORT_ROOT / "reference").is_dir() else None
_INSTALLED_DEVIATIONS = PACKAGE_DIR / "known_deviations.toml"
DEVIATIONS_FILE = _INSTALLED_DEVIATIONS if _INSTALLED_DEVIATIONS.is_file() else IMPORT_ROOT / "known_deviations.toml"
REFERENCE = "reference" if REPO_ROOT is not None and PACKAGE_DIR.name == "suite" and PACKAGE == "suite" \
    else f"{PACKAGE}.reference"


class _EngineNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """In an editable install (``tf_distribute_suite`` mapped onto the checkout's ``suite/``) engines
    run as ``suite`` (ENGINE_MODULE) and their replies name ``suite.…`` classes: here those names are
    the modules this process imports as ``tf_distribute_suite.…``, the same objects, so that a reply
    unpickles wherever the command runs (outside the checkout ``suite`` is not importable)."""

    def find_spec(self, name, path=None, target=None):
        if name == PACKAGE_DIR.name or name.startswith(PACKAGE_DIR.name + "."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(PACKAGE + spec.name[len(PACKAGE_DIR.name):])

    def exec_module(self, module):
        pass  # imported already, under this process's name


def alias_engine_names() -> None:
    """Where the engines' package name differs from this process's (an editable install), make it
    name this process's modules (first: in the checkout ``suite`` would be another copy of them);
    elsewhere nothing."""
    if PACKAGE != PACKAGE_DIR.name and PACKAGE in NAMES and not any(isinstance(f, _EngineNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _EngineNames())


def reference(module: str):
    """The reference module ``module`` (``reference.<module>`` here, ``tf_distribute_suite.reference.<module>``
    installed)."""
    return importlib.import_module(f"{REFERENCE}.{module}")


def engine_cwd() -> Path:
    """Where engines run: the checkout (the suite's own workloads and examples import from it),
    else the user's current directory."""
    return REPO_ROOT or Path(os.getcwd())


def project_dir() -> Path:
    """Where ``.tox/ENV`` is looked up for ``SPEC@ENV``: the checkout, else the current directory."""
    return REPO_ROOT or Path(os.getcwd())


def engine_pythonpath(existing: str | None) -> str:
    """PYTHONPATH for an engine: the folder this package imports from first, then ``existing``."""
    return os.pathsep.join([str(IMPORT_ROOT)] + [p for p in (existing or "").split(os.pathsep) if p])
