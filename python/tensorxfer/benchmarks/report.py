"""Shared helpers for the side-by-side benchmarks: timing, medians, ratio tables, JSON and PNG.

A benchmark records :class:`Measurement` rows (one per case x variant x metric,
each with its raw samples), then :meth:`Report.compare` turns a candidate and a
baseline into a ratio against a target.  ``Report.table()`` prints everything,
``Report.write(out_dir, stem)`` writes ``<stem>.json`` and ``<stem>.png``.

Ratios are always "how many times better the candidate is": baseline/candidate
for times and latencies, candidate/baseline for throughputs.  A miss is
reported, never raised.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tensorxfer._info import _cpu_features, cpu_summary


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``samples`` by linear interpolation."""
    if not samples:
        raise ValueError("percentile: samples is empty")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(samples: Sequence[float]) -> float:
    """The median of ``samples`` (ValueError when empty)."""
    if not samples:
        raise ValueError("median: samples is empty")
    return float(statistics.median(samples))


def time_interleaved(variants: Mapping[str, Callable[[], Any]], repeats: int,
                     warmup: int = 1) -> dict[str, list[float]]:
    """Runs every variant ``repeats`` times, rotating the order each round; seconds per call.

    Interleaving spreads machine noise (frequency, other processes) over every
    variant instead of penalising whichever happened to run during it.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            begin = time.perf_counter()
            variants[name]()
            samples[name].append(time.perf_counter() - begin)
    return samples


def time_in_blocks(variants: Mapping[str, Callable[[], Any]], rounds: int,
                   block: int) -> dict[str, list[float]]:
    """Runs each variant ``block`` times in a row (the first call not timed), ``rounds``
    times, rotating which variant goes first; seconds per call.

    Where :func:`time_interleaved` shows a variant called among the others, this
    shows it in a loop of its own: what a variant leaves running after a call
    (torch's OpenMP workers poll for a while) only touches its own next call.
    """
    if rounds < 1 or block < 2:
        raise ValueError(f"rounds must be >= 1 and block >= 2, got {rounds} and {block}")
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            call = variants[name]
            call()
            for _ in range(block - 1):
                begin = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - begin)
    return samples


@dataclasses.dataclass
class Measurement:
    """One measured quantity: its median ``value`` in ``unit`` and the raw ``samples``."""

    case: str
    variant: str
    metric: str
    value: float
    unit: str
    lower_is_better: bool
    samples: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Comparison:
    """Candidate vs baseline on one metric: ``ratio`` > 1 means the candidate is better."""

    case: str
    metric: str
    candidate: str
    baseline: str
    ratio: float
    target: float | None
    met: bool | None


class Report:
    """Collects measurements and comparisons of one benchmark run."""

    def __init__(self, title: str, config: Mapping[str, Any] | None = None) -> None:
        """``title`` names the benchmark; ``config`` (sizes, repeats) goes into the JSON.

        A machine already busy at the start (1-minute load average above half
        its CPUs) is noted, since every ratio is then noisier.
        """
        self.title = title
        self.config = dict(config or {})
        self.measurements: list[Measurement] = []
        self.comparisons: list[Comparison] = []
        self.notes: list[str] = []
        load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
        if load > cpus / 2:
            self.note(f"the machine was busy when the run started (load average {load:.1f} on {cpus} CPUs): "
                      "expect noisy numbers")

    def add(self, case: str, variant: str, metric: str, samples: Sequence[float], unit: str,
            *, lower_is_better: bool, value: float | None = None) -> Measurement:
        """Records ``samples``; the row's value is their median unless ``value`` is given."""
        samples = [float(s) for s in samples]
        measured = Measurement(case, variant, metric, median(samples) if value is None else float(value),
                               unit, lower_is_better, samples)
        self.measurements.append(measured)
        return measured

    def find(self, case: str, variant: str, metric: str) -> Measurement:
        """The measurement recorded for (case, variant, metric); KeyError if none."""
        for measured in self.measurements:
            if (measured.case, measured.variant, measured.metric) == (case, variant, metric):
                return measured
        raise KeyError(f"no measurement for case={case!r} variant={variant!r} metric={metric!r}")

    def compare(self, case: str, metric: str, candidate: str, baseline: str,
                target: float | None = None) -> Comparison:
        """Ratio of ``candidate`` over ``baseline`` (better-is-bigger) against ``target``."""
        cand = self.find(case, candidate, metric)
        base = self.find(case, baseline, metric)
        if cand.lower_is_better:
            ratio = base.value / cand.value if cand.value > 0 else float("inf")
        else:
            ratio = cand.value / base.value if base.value > 0 else float("inf")
        met = None if target is None else bool(ratio >= target)
        comparison = Comparison(case, metric, candidate, baseline, ratio, target, met)
        self.comparisons.append(comparison)
        return comparison

    def note(self, text: str) -> None:
        """Adds a free-form line printed under the table and stored in the JSON."""
        self.notes.append(text)

    def table(self) -> str:
        """The CPU (:func:`cpu_header`), measurements, then comparisons with ratio, target and whether it was met."""
        rows: list[tuple[str, ...]] = [("case", "variant", "metric", "median", "unit", "n")]
        for m in self.measurements:
            rows.append((m.case, m.variant, m.metric, _number(m.value), m.unit, str(len(m.samples))))
        text = [f"== {self.title} ==", cpu_header(), _align(rows), "", "ratios (>1 = tensorxfer better):"]
        comparison_rows: list[tuple[str, ...]] = [
            ("case", "metric", "candidate", "vs baseline", "ratio", "target", "met")]
        for c in self.comparisons:
            comparison_rows.append((c.case, c.metric, c.candidate, c.baseline, f"{c.ratio:.2f}x",
                         "-" if c.target is None else f">= {c.target:g}x",
                         {None: "-", True: "yes", False: "NO"}[c.met]))
        text.append(_align(comparison_rows))
        text.extend(f"note: {line}" for line in self.notes)
        return "\n".join(text)

    def to_json(self) -> dict[str, Any]:
        """Everything recorded, plus the machine and the config, as a JSON-ready dict."""
        return {
            "title": self.title,
            "machine": machine_info(),
            "cpu_header": cpu_header(),
            "config": self.config,
            "measurements": [dataclasses.asdict(m) for m in self.measurements],
            "comparisons": [dataclasses.asdict(c) for c in self.comparisons],
            "notes": list(self.notes),
        }

    def write(self, out_dir: str | os.PathLike, stem: str) -> tuple[Path, Path | None]:
        """Writes ``<out_dir>/<stem>.json`` and, with matplotlib, ``<stem>.png``; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        png_path: Path | None = out / f"{stem}.png"
        if not plot_comparisons(self, out / f"{stem}.png"):
            png_path = None
        json_path = out / f"{stem}.json"
        json_path.write_text(json.dumps(self.to_json(), indent=2, default=_json_default) + "\n")
        return json_path, png_path


def plot_comparisons(report: Report, path: Path) -> bool:
    """Bar chart of every comparison's ratio with its target marked; False without matplotlib."""
    # A Figure with its own Agg canvas, not pyplot: the caller's matplotlib backend and
    # pyplot's figure list stay as they were.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        report.note("matplotlib is not installed: no PNG written (pip install matplotlib)")
        return False
    comparisons = report.comparisons
    if not comparisons:
        return False
    labels = [f"{c.case} | {c.metric}\n{c.candidate} vs {c.baseline}" for c in comparisons]
    colors = ["tab:gray" if c.met is None else ("tab:green" if c.met else "tab:red") for c in comparisons]
    figure = Figure(figsize=(11.0, 1.5 + 0.42 * len(comparisons)))
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    positions = list(range(len(comparisons)))[::-1]  # first comparison at the top
    axes.barh(positions, [c.ratio for c in comparisons], color=colors, height=0.7)
    for position, c in zip(positions, comparisons):
        if c.target is not None:
            axes.vlines(c.target, position - 0.42, position + 0.42, colors="black", linestyles="dashed")
        axes.annotate(f" {c.ratio:.2f}x", (c.ratio, position), va="center", fontsize=7)
    axes.axvline(1.0, color="gray", linewidth=0.8)
    axes.set_yticks(positions)
    axes.set_yticklabels(labels, fontsize=6.5)
    axes.set_xscale("log")
    axes.set_xlabel("ratio, log scale (>1: tensorxfer better; dashed: target; green met, red missed, gray no target)")
    axes.set_title(report.title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def machine_info() -> dict[str, Any]:
    """CPU model, family, SIMD flags and count, OS, and the versions of Python, numpy, torch and tensorxfer."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "cpu": _cpu_features(),
        "load_average_1_5_15": list(os.getloadavg()),
    }
    for module in ("numpy", "torch", "tensorxfer"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    return info


def cpu_header() -> str:
    """One line naming the CPU so that two tables from different machines cannot be confused.

    For example ``CPU: AMD EPYC 7B13 (AuthenticAMD family 25 model 1; AVX2 yes, AVX-512 no;
    kernels avx2; last-level cache 32 MiB; 2 CPUs)``. A ``TENSORXFER_CPU_*`` override is
    marked ``forced`` (``tensorxfer info`` prints the same summary).
    """
    return f"CPU: {_cpu_model()} ({cpu_summary(_cpu_features())})"


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _number(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return f"{value:.3e}"


def _align(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in rows)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
