"""Shared benchmark report helper for the scripts in bench/python.

The implementation ships with the package (``tensorxfer.benchmarks.report``) so
``python -m tensorxfer bench`` works from an installed wheel; scripts here do
``from _report import Report, time_interleaved, percentile, median``.
"""

from tensorxfer.benchmarks.report import (  # noqa: F401
    Comparison,
    Measurement,
    Report,
    cpu_header,
    machine_info,
    median,
    percentile,
    plot_comparisons,
    time_interleaved,
)
