"""A script run in an engine as in a process of its own: ``isolated`` gives it its ``sys.argv``, path,
working and temporary folders and environment for the run (all put back after), ``execute`` runs it."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.util
import os
import runpy
import shutil
import sys
import tempfile

from .errors import ScriptError

_ABSENT = object()


@contextlib.contextmanager
def isolated(argv: list, folder: str, root: str | None = None, environ: dict | None = None):
    """``sys.argv``, ``sys.path`` (``root`` first: the script's folder, or for an entry function the
    folder its package is found from), the working folder (a fresh one, removed after), the
    temporary folder (``tempfile``'s, ``TMPDIR`` and ``multiprocessing.util.get_temp_dir()``: one
    inside the working folder), the environment (``environ`` set over it; what the script sets is
    undone) and the modules imported from ``folder``, as in a process of its own: files the script
    writes at relative or temporary paths neither reach another run nor stay behind."""
    saved = list(sys.argv), list(sys.path), os.getcwd(), set(sys.modules)
    saved_environ, saved_tempdir = dict(os.environ), tempfile.tempdir
    mp_config = getattr(multiprocessing.current_process(), "_config", {})  # get_temp_dir()'s cache (private)
    saved_mp_tempdir = mp_config.pop("tempdir", _ABSENT)
    work = tempfile.mkdtemp(prefix="tfds-script-")
    temp = os.path.join(work, ".tmp")
    os.mkdir(temp)
    sys.argv[:] = argv
    sys.path.insert(0, root or folder)
    os.environ.update(environ or {})
    os.environ["TMPDIR"] = tempfile.tempdir = temp
    os.chdir(work)
    try:
        yield work
    finally:
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        for key in set(os.environ) - set(saved_environ):
            del os.environ[key]
        os.environ.update(saved_environ)
        tempfile.tempdir = saved_tempdir
        made = mp_config.pop("tempdir", None)
        if saved_mp_tempdir is not _ABSENT:
            mp_config["tempdir"] = saved_mp_tempdir
        if made:  # the folder goes with the working folder: its exit-time removal is not needed
            for finalizer in list(getattr(multiprocessing.util, "_finalizer_registry", {}).values()):
                if made in (getattr(finalizer, "_args", None) or ()):
                    finalizer.cancel()
        for name in set(sys.modules) - saved[3]:
            module = sys.modules.get(name)
            if getattr(module, "__file__", None) and os.path.realpath(module.__file__).startswith(
                    os.path.realpath(folder) + os.sep):
                del sys.modules[name]
        shutil.rmtree(work, ignore_errors=True)


def execute(path: str | None, entry: str | None) -> None:
    """Run the script at ``path`` as ``python path ARGS`` would (``__name__ == "__main__"``), or
    call the entry function ``entry`` (``pkg.module:function``); ``sys.argv`` is set already."""
    if path is not None:
        runpy.run_path(path, run_name="__main__")
        return
    target = entry
    module_name, _, attr = entry.partition(":")
    sys.modules.pop(module_name, None)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ScriptError(f"script {target!r}: module {module_name!r} does not import "
                          f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})"
                          ) from None
    entry = getattr(module, attr, None)
    if not callable(entry):
        raise ScriptError(f"script {target!r}: module {module_name!r} has no function {attr!r}")
    entry()
