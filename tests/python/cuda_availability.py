"""Whether the CUDA tests may skip: never when torch sees a GPU that tensorxfer's core does not.

A core whose CUDA runtime cannot start (a driver older than the toolkit it was built with)
reports 0 devices; if the CUDA tests then skipped, a GPU run would pass without testing
anything. Every CUDA test module calls ``fail_if_the_core_misses_torchs_gpu`` at import,
so such a run fails (a collection error) and says why.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from tensorxfer import _core


def core_misses_torchs_gpu(torch: Any) -> Optional[str]:
    """Why the run must fail, or None: torch sees a GPU, the core was built with CUDA and sees none."""
    if not torch.cuda.is_available():
        return None
    status = _core.cuda_status()
    if not status["compiled"] or status["device_count"] > 0:
        return None
    return (
        f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s) but tensorxfer's core "
        f"(built against CUDA runtime {status['runtime_version']}) sees none: {status['reason']}"
    )


def fail_if_the_core_misses_torchs_gpu(torch: Any) -> None:
    """``pytest.fail`` (not a skip) when ``core_misses_torchs_gpu`` says why."""
    reason = core_misses_torchs_gpu(torch)
    if reason is not None:
        pytest.fail(reason, pytrace=False)
