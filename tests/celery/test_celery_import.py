"""The Celery integration's import name, ``coordinator.celery``: a project's own
``worker.py`` (most Celery projects have one) does not shadow it, and the core loads no
Celery until it is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(code: str, cwd: Path) -> str:
    """``python -c code`` in ``cwd`` (first on its sys.path); its output, or the failure."""
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_projects_own_worker_py_does_not_shadow_the_integration(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text("from celery import Celery\n\n"
                                        "app = Celery('mine')\n")
    out = _run("import worker\n"
               "from coordinator.celery import contained, current_context, install\n"
               "install(worker.app)\n"
               "print(worker.__file__)\n", tmp_path)
    assert out.strip() == str(tmp_path / "worker.py")


def test_the_former_import_name_still_works(tmp_path: Path) -> None:
    out = _run("import coordinator.celery, worker\n"
               "print(worker.contained is coordinator.celery.contained,\n"
               "      worker.TaskStoppedError is coordinator.celery.TaskStoppedError)\n",
               tmp_path)
    assert out.split() == ["True", "True"]


def test_importing_the_core_loads_no_celery(tmp_path: Path) -> None:
    out = _run("import sys, coordinator\n"
               "print([m for m in ('celery', 'kombu', 'worker', 'coordinator.celery')\n"
               "       if m in sys.modules])\n", tmp_path)
    assert out.strip() == "[]"
