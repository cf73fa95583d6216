"""Helpers shared by the replay transfer backend tests."""

from __future__ import annotations

from typing import Any, List

import numpy as np


def to_numpy(tensor: Any) -> np.ndarray:
    """A host numpy copy of a numpy array or a torch tensor on any device."""
    if isinstance(tensor, np.ndarray):
        return tensor.copy()
    return tensor.detach().cpu().numpy()


class RecordingTraceRecorder:
    """A trace recorder that keeps every call."""

    def __init__(self) -> None:
        self.slices: List[tuple] = []
        self.pending_spans: List[tuple] = []

    def add_slice(self, name, category, begin_ns, end_ns, args) -> None:
        self.slices.append((name, category, begin_ns, end_ns, dict(args)))

    def add_cuda_pending_span(self, name, category, cpu_begin_ns, start_event, end_event, args) -> None:
        self.pending_spans.append((name, category, cpu_begin_ns, start_event, end_event, dict(args)))
