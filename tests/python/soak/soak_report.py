"""The soak's samples: each process's RSS and open file descriptors and the soak's /dev/shm, by
role, once per interval; the growth check; the table and the plot."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional

# Growth allowed after the warm-up, per role (check_growth says how it is measured).
RSS_GROWTH_MIB = 64.0
FD_GROWTH = 8
SHM_GROWTH_MIB = 1.0


@dataclass
class Sample:
    seconds: float
    rss_mib: Dict[str, float] = field(default_factory=dict)   # role -> RSS
    fds: Dict[str, int] = field(default_factory=dict)         # role -> open file descriptors
    shm_mib: float = 0.0                                      # the soak's segments in /dev/shm
    shm_segments: int = 0
    batches: int = 0


def process_rss_mib(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_fds(pid: int) -> Optional[int]:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def descendants(pid: int) -> List[int]:
    """Every live process below ``pid`` (from /proc's children lists)."""
    found: List[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    kids = [int(word) for word in children.read().split()]
                found.extend(kids)
                pending.extend(kids)
        except OSError:
            continue
    return found


def soak_segments(pids: Iterable[int], group_prefix: str) -> List[str]:
    """Names in /dev/shm the soak made: segments whose creator pid is one of ``pids`` (named
    ``tensorxfer-<pid>-...``) and group segments whose name starts with ``group_prefix``."""
    wanted = {str(pid) for pid in pids}
    names = []
    for name in os.listdir("/dev/shm"):
        if not name.startswith("tensorxfer-"):
            continue
        creator = name[len("tensorxfer-"):].split("-", 1)[0]
        if creator in wanted or name.startswith(group_prefix):
            names.append(name)
    return names


def shm_usage_mib(names: Iterable[str]) -> float:
    total = 0
    for name in names:
        try:
            total += os.stat(f"/dev/shm/{name}").st_blocks * 512
        except OSError:
            pass
    return total / (1 << 20)


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] +
                                                                 ordered[len(ordered) // 2]) / 2


def check_growth(samples: List[Sample], warmup_s: float) -> List[str]:
    """Roles whose RSS or fds grew past the bounds after the warm-up, and /dev/shm growth.

    Growth is the median of the last three samples less the median of the first three after the
    warm-up (fewer when there are fewer): a process that allocates and frees tens of MiB per
    operation (an all_reduce of 16 MiB) moves by that much between two single samples."""
    after = [sample for sample in samples if sample.seconds >= warmup_s]
    if len(after) < 2:
        return []
    window = max(1, min(3, len(after) // 2))
    first, last = after[:window], after[-window:]
    problems = []

    def growth(metric: str, role: str) -> Optional[tuple]:
        before = [getattr(sample, metric)[role] for sample in first if role in getattr(sample, metric)]
        now = [getattr(sample, metric)[role] for sample in last if role in getattr(sample, metric)]
        return (_median(before), _median(now)) if before and now else None

    for role in last[-1].rss_mib:
        rss = growth("rss_mib", role)
        if rss is not None and rss[1] - rss[0] > RSS_GROWTH_MIB:
            problems.append(f"{role}: RSS grew {rss[1] - rss[0]:.1f} MiB ({rss[0]:.1f} -> {rss[1]:.1f}, medians), "
                            f"more than {RSS_GROWTH_MIB:g}")
        fds = growth("fds", role)
        if fds is not None and fds[1] - fds[0] > FD_GROWTH:
            problems.append(f"{role}: open fds grew {fds[0]:g} -> {fds[1]:g} (medians), more than {FD_GROWTH}")
    shm_before = _median([sample.shm_mib for sample in first])
    shm_now = _median([sample.shm_mib for sample in last])
    if shm_now - shm_before > SHM_GROWTH_MIB:
        problems.append(f"/dev/shm: the soak's segments grew {shm_before:.1f} -> {shm_now:.1f} MiB")
    return problems


def table(samples: List[Sample]) -> str:
    roles = sorted({role for sample in samples for role in sample.rss_mib})
    header = f"{'min':>6} {'batches':>9} {'shm MiB':>8} " + " ".join(f"{role[:14]:>14}" for role in roles)
    lines = ["RSS MiB / open fds per role (relays: summed over the relay processes, whose pages shared with "
             "the relay host count in each)", header]
    for sample in samples:
        cells = []
        for role in roles:
            rss, fds = sample.rss_mib.get(role), sample.fds.get(role)
            cells.append(f"{'-' if rss is None else f'{rss:.0f}/{fds}':>14}")
        lines.append(f"{sample.seconds / 60:6.1f} {sample.batches:9d} {sample.shm_mib:8.1f} " + " ".join(cells))
    return "\n".join(lines)


def write(samples: List[Sample], directory: str) -> List[str]:
    """samples.json, and soak.png where matplotlib is installed; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = [os.path.join(directory, "samples.json")]
    with open(written[0], "w") as out:
        json.dump([asdict(sample) for sample in samples], out, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    figure, (rss_axis, fd_axis) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    roles = sorted({role for sample in samples for role in sample.rss_mib})
    minutes = [sample.seconds / 60 for sample in samples]
    for role in roles:
        rss_axis.plot(minutes, [sample.rss_mib.get(role, float("nan")) for sample in samples], marker="o", label=role)
        fd_axis.plot(minutes, [sample.fds.get(role, float("nan")) for sample in samples], marker="o", label=role)
    rss_axis.plot(minutes, [sample.shm_mib for sample in samples], "k--", label="/dev/shm (soak)")
    rss_axis.set_ylabel("MiB")
    fd_axis.set_ylabel("open fds")
    fd_axis.set_xlabel("minutes")
    rss_axis.legend(fontsize=7, ncol=3)
    rss_axis.set_title(f"tensorxfer soak, {time.strftime('%Y-%m-%d %H:%M')}")
    figure.tight_layout()
    written.append(os.path.join(directory, "soak.png"))
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)
    return written
