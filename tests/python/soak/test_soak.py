"""The soak (soak.py) in the stress tier: its length from TENSORXFER_SOAK_MINUTES (default 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from child_process import child_environment
from conftest import torch_or_skip

torch_or_skip()

MINUTES = float(os.environ.get("TENSORXFER_SOAK_MINUTES", "10"))

pytestmark = [pytest.mark.stress, pytest.mark.multiprocess, pytest.mark.timeout(int(MINUTES * 60) + 600)]


def test_soak_keeps_memory_flat_and_loses_no_batch(tmp_path):
    soak = Path(__file__).resolve().with_name("soak.py")
    sample_seconds = "60" if MINUTES >= 5 else str(max(5.0, MINUTES * 60 / 6))
    kill_seconds = "60" if MINUTES >= 3 else str(max(10.0, MINUTES * 60 / 4))
    result = subprocess.run([sys.executable, str(soak), "--minutes", str(MINUTES), "--sample-seconds", sample_seconds,
                             "--kill-seconds", kill_seconds, "--out", str(tmp_path)],
                            env=child_environment(), capture_output=True, text=True)
    print(result.stdout[-20000:])
    print(result.stderr[-5000:], file=sys.stderr)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "soak PASSED" in result.stdout
