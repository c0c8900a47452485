"""What this machine has, read without TensorFlow: GPU names from ``nvidia-smi -L``."""

from __future__ import annotations

import os
import shutil
import subprocess


def gpu_names() -> list[str]:
    """``["GPU 0: NVIDIA H200 (UUID: ...)", ...]``; empty without nvidia-smi or GPUs."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU")]


def gpu_count(names: list[str] | None = None, visible: str | None = None) -> int:
    """How many GPUs an engine's ``MirroredStrategy()`` uses: those ``CUDA_VISIBLE_DEVICES`` names
    when it is set (``""`` or ``-1`` hide them all), else every GPU ``nvidia-smi -L`` lists."""
    names = gpu_names() if names is None else names
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None:
        return len(names)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if "-1" in ids:
        ids = ids[:ids.index("-1")]  # CUDA stops at the first invalid id
    return min(len(ids), len(names))
