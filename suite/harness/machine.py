"""What this machine has, read without TensorFlow: GPU names from ``nvidia-smi -L``."""

from __future__ import annotations

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
