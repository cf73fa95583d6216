"""Replay benchmark: each tensorxfer path side by side with the baseline a user would pick.

Cases (sizes shrink with ``--quick``):

* pack: gather 4096 rows of 4 KiB from a 512 MiB float32 store with
  ``pack_rows`` vs ``numpy.take(out=)`` and ``torch.index_select(out=)``, beside the memory
  floor: the same bytes copied as one contiguous block by the same threads.
* host copy: submit + wait of 64 MiB through the host replay transfer backend
  vs ``numpy.copyto`` and ``torch.Tensor.copy_``.
* device copy (with a CUDA device): submit + wait of 64 MiB from a registered
  (pinned) host slot through the CUDA replay transfer backend vs
  ``Tensor.copy_(non_blocking=True)`` from pinned memory on a side stream with
  a blocking event (the backend's mechanism) and on the current stream, and
  ``Tensor.copy_`` from pageable memory, each followed by its wait; skipped,
  with the reason, without a device.
* handoff: cross-process latency of a 64-byte batch sent every 0.5 ms to a
  waiting consumer, and throughput of 4 MiB batches, SlotRing (default standard
  wait, spin off, and a fixed 1 ms spin that outlasts the publish interval) vs
  ``multiprocessing.Queue`` and ``torch.multiprocessing.Queue``.

Variants are interleaved round by round and medians reported (pack also with
each variant in a loop of its own, "back-to-back"); every ratio is printed next
to its target.  Misses are reported, never fatal.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from tensorxfer.benchmarks import handoff
from tensorxfer.benchmarks.report import Report, machine_info, percentile, time_in_blocks, time_interleaved

FULL = {"store_bytes": 512 << 20, "row_bytes": 4096, "pack_rows": 4096, "copy_bytes": 64 << 20,
        "repeats": 15, "latency_batches": 2000, "latency_warmup": 100, "interval_s": 0.0005,
        "throughput_batches": 300, "throughput_bytes": 4 << 20, "handoff_rounds": 3}
QUICK = {"store_bytes": 16 << 20, "row_bytes": 4096, "pack_rows": 512, "copy_bytes": 4 << 20,
         "repeats": 3, "latency_batches": 100, "latency_warmup": 10, "interval_s": 0.0005,
         "throughput_batches": 30, "throughput_bytes": 1 << 20, "handoff_rounds": 1}
CASES = ("pack", "copy", "device_copy", "handoff")
FLOOR = "floor: one contiguous block (CopyEngine.copy)"


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def bench_pack(report: Report, sizes: dict) -> None:
    """pack_rows vs numpy.take(out=) vs torch.index_select(out=)."""
    from tensorxfer.ipc import PackLayout, pack_rows
    from tensorxfer.ipc.pack import default_copy_engine

    row_floats = sizes["row_bytes"] // 4
    store_rows = sizes["store_bytes"] // sizes["row_bytes"]
    batch = sizes["pack_rows"]
    case = f"pack {batch} rows x {sizes['row_bytes'] // 1024} KiB from {sizes['store_bytes'] >> 20} MiB"
    store = np.empty((store_rows, row_floats), dtype=np.float32)
    store[:] = np.arange(store_rows, dtype=np.float32)[:, None]  # every row distinct, pages faulted
    indices = np.random.default_rng(0).integers(0, store_rows, size=batch, dtype=np.int64)
    layout = PackLayout({"rows": ("float32", (row_floats,))}, rows=batch)
    packed = np.zeros(layout.nbytes, dtype=np.uint8)
    taken = np.zeros((batch, row_floats), dtype=np.float32)
    # The memory floor: the same bytes as one contiguous block, copied by the threads pack_rows uses.
    engine = default_copy_engine()
    block = store.reshape(-1)[:batch * row_floats]
    copied = np.zeros_like(block)
    variants = {
        "tensorxfer.pack_rows": lambda: pack_rows(packed, layout, sources={"rows": store}, indices=indices),
        "numpy.take(out=)": lambda: np.take(store, indices, axis=0, out=taken),
        FLOOR: lambda: engine.copy(copied, block),
    }
    torch = _torch()
    if torch is not None:
        store_t, indices_t = torch.from_numpy(store), torch.from_numpy(indices)
        selected = torch.zeros((batch, row_floats), dtype=torch.float32)
        variants["torch.index_select(out=)"] = lambda: torch.index_select(store_t, 0, indices_t, out=selected)
    samples = time_interleaved(variants, sizes["repeats"])
    in_blocks = time_in_blocks(variants, rounds=3, block=max(2, sizes["repeats"] // 3))
    expected = store[indices]
    got = layout.unpack(packed)["rows"]
    if not np.array_equal(np.asarray(got), expected) or not np.array_equal(taken, expected):
        raise AssertionError("pack benchmark: pack_rows / numpy.take produced wrong rows")
    if torch is not None and not np.array_equal(selected.numpy(), expected):
        raise AssertionError("pack benchmark: torch.index_select produced wrong rows")
    moved = batch * sizes["row_bytes"]
    for name, seconds in samples.items():
        report.add(case, name, "time", [s * 1e3 for s in seconds], "ms", lower_is_better=True)
        report.add(case, name, "bandwidth", [moved / s / 1e9 for s in seconds], "GB/s", lower_is_better=False)
    for name, seconds in in_blocks.items():
        report.add(case, name, "time back-to-back", [s * 1e3 for s in seconds], "ms", lower_is_better=True)
    for metric in ("time", "time back-to-back"):
        report.compare(case, metric, "tensorxfer.pack_rows", "numpy.take(out=)", target=3.0)
        if torch is not None:
            report.compare(case, metric, "tensorxfer.pack_rows", "torch.index_select(out=)", target=1.2)
            report.compare(case, metric, "torch.index_select(out=)", FLOOR)
        report.compare(case, metric, "tensorxfer.pack_rows", FLOOR)
    if torch is not None:
        report.note("pack: 'time' interleaves the variants call by call; torch's OpenMP workers keep polling "
                    "for a while after each call (unless OMP_WAIT_POLICY=passive), taking CPU from the variant "
                    "timed next when there are few cores. 'time back-to-back' runs each variant in a loop of "
                    "its own, what a learner's loop does (the copy engine's workers poll for 50 us after a job "
                    "only while jobs come back to back, so they sleep between the interleaved calls)")


def add_copy_samples(report: Report, case: str, samples: dict, nbytes: int) -> None:
    """Each variant's copy times (ms) and bandwidths (GB/s) of `nbytes`."""
    for name, seconds in samples.items():
        report.add(case, name, "time", [s * 1e3 for s in seconds], "ms", lower_is_better=True)
        report.add(case, name, "bandwidth", [nbytes / s / 1e9 for s in seconds], "GB/s", lower_is_better=False)


def bench_copy(report: Report, sizes: dict) -> None:
    """Host backend submit_h2d + synchronize_ready vs numpy.copyto vs torch.Tensor.copy_."""
    from tensorxfer.ipc.replay_pipelines.transfer import build_replay_transfer_backend

    nbytes = sizes["copy_bytes"]
    case = f"host copy {nbytes >> 20} MiB (submit + wait)"
    source = np.full(nbytes, 3, dtype=np.uint8)
    target = np.zeros(nbytes, dtype=np.uint8)
    backend = build_replay_transfer_backend(device="cpu", ring_depth=1)
    try:
        def host_backend() -> None:
            backend.submit_h2d(slot=0, dst=target, src=source)
            backend.synchronize_ready(0)

        variants = {"tensorxfer host backend": host_backend,
                    "numpy.copyto": lambda: np.copyto(target, source)}
        torch = _torch()
        if torch is not None:
            source_t, target_t = torch.from_numpy(source), torch.from_numpy(target)
            variants["torch.Tensor.copy_"] = lambda: target_t.copy_(source_t)
        target[:] = 0
        host_backend()
        if not np.array_equal(target, source):
            raise AssertionError("copy benchmark: the host backend did not copy the bytes")
        samples = time_interleaved(variants, sizes["repeats"])
    finally:
        backend.close()
    add_copy_samples(report, case, samples, nbytes)
    baselines = [name for name in samples if name != "tensorxfer host backend"]
    faster = min(baselines, key=lambda name: report.find(case, name, "time").value)
    report.compare(case, "time", "tensorxfer host backend", faster, target=0.95)


def bench_device_copy(report: Report, sizes: dict) -> None:
    """CUDA backend submit_h2d + synchronize_ready vs torch copies into the same device tensor."""
    torch = _torch()
    case = f"device copy {sizes['copy_bytes'] >> 20} MiB (submit + wait)"
    if torch is None or not torch.cuda.is_available():
        report.note(f"{case}: skipped: " + ("torch is not installed" if torch is None
                                             else "no CUDA device (torch.cuda.is_available() is False)"))
        return
    from tensorxfer.ipc.replay_pipelines.transfer import build_replay_transfer_backend

    nbytes = sizes["copy_bytes"]
    slot = torch.full((nbytes,), 3, dtype=torch.uint8)
    pageable = torch.full((nbytes,), 3, dtype=torch.uint8)
    pinned = torch.full((nbytes,), 3, dtype=torch.uint8).pin_memory()
    backend = build_replay_transfer_backend(device="cuda", ring_depth=1)
    try:
        backend.register_host_slots([slot])
        target = backend.allocate_device_slots(count=1, shape=(nbytes,), dtype=torch.uint8)[0]

        def cuda_backend() -> None:
            backend.submit_h2d(slot=0, dst=target, src=slot)
            backend.synchronize_ready(0)

        def torch_pinned() -> None:
            target.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()

        side_stream = torch.cuda.Stream()
        copied = torch.cuda.Event(blocking=True)

        def torch_side_stream() -> None:  # the backend's mechanism: a copy stream and a sleeping wait
            with torch.cuda.stream(side_stream):
                target.copy_(pinned, non_blocking=True)
                copied.record(side_stream)
            copied.synchronize()

        def torch_pageable() -> None:
            target.copy_(pageable)
            torch.cuda.synchronize()

        target.zero_()
        cuda_backend()
        if not bool((target == 3).all()):
            raise AssertionError("device copy benchmark: the CUDA backend did not copy the bytes")
        samples = time_interleaved({"tensorxfer cuda backend": cuda_backend,
                                    "torch copy_ from pinned": torch_pinned,
                                    "torch side stream + blocking event": torch_side_stream,
                                    "torch copy_ from pageable": torch_pageable}, sizes["repeats"])
        facts = (f"device copy on {torch.cuda.get_device_name()}: h2d_submitter {backend.h2d_submitter}, "
                 f"slot pinned in place {backend.host_pinned}")
    finally:
        backend.close()
    add_copy_samples(report, case, samples, nbytes)
    for baseline in ("torch side stream + blocking event", "torch copy_ from pinned", "torch copy_ from pageable"):
        report.compare(case, "time", "tensorxfer cuda backend", baseline)
    report.note(facts)
    report.note("device copy: the backend orders its copy stream after the caller's stream and waits in a "
                "blocking event (the waiting thread sleeps); torch copy_ + torch.cuda.synchronize() waits "
                "on the caller's stream, spinning or yielding as the CUDA context's schedule decides")


def bench_handoff(report: Report, sizes: dict) -> None:
    """Cross-process latency (64 B every 0.5 ms) and throughput (4 MiB batches)."""
    transports = handoff.available_transports()
    latency_case = f"handoff latency 64 B every {sizes['interval_s'] * 1e3:g} ms"
    throughput_case = f"handoff throughput {sizes['throughput_bytes'] >> 20} MiB batches"
    p50s: dict[str, list[float]] = {t: [] for t in transports}
    p99s: dict[str, list[float]] = {t: [] for t in transports}
    rates: dict[str, list[float]] = {t: [] for t in transports}
    cpus: dict[str, list[float]] = {t: [] for t in transports}
    demands: dict[str, list[float]] = {t: [] for t in transports}
    for round_index in range(sizes["handoff_rounds"]):
        shift = round_index % len(transports)
        for transport in transports[shift:] + transports[:shift]:
            cost = handoff.measure_consumer_cost(transport, sizes["latency_batches"], sizes["interval_s"],
                                                 sizes["latency_warmup"])
            lat = cost.latencies_us
            cpus[transport].append(cost.cpu_percent)
            if cost.demand_percent is not None:
                demands[transport].append(cost.demand_percent)
            p50s[transport].append(percentile(lat, 50))
            p99s[transport].append(percentile(lat, 99))
            rates[transport].append(handoff.measure_throughput(
                transport, sizes["throughput_batches"], sizes["throughput_bytes"]))
    for transport in transports:
        label = handoff.LABELS[transport]
        report.add(latency_case, label, "p50", p50s[transport], "us", lower_is_better=True)
        report.add(latency_case, label, "p99", p99s[transport], "us", lower_is_better=True)
        report.add(latency_case, label, "consumer CPU", cpus[transport], "% of a core", lower_is_better=True)
        if demands[transport]:
            report.add(latency_case, label, "consumer CPU wanted", demands[transport], "% of a core",
                       lower_is_better=True)
        report.add(throughput_case, label, "throughput", rates[transport], "batches/s", lower_is_better=False)
        report.add(throughput_case, label, "bandwidth",
                   [r * sizes["throughput_bytes"] / 1e9 for r in rates[transport]], "GB/s",
                   lower_is_better=False)
    baselines = [handoff.LABELS[t] for t in transports if not t.startswith("slot_ring")]
    rings = [t for t in transports if t.startswith("slot_ring")]
    for ring in rings:
        for baseline in baselines:
            report.compare(latency_case, "p50", handoff.LABELS[ring], baseline, target=20.0)
            report.compare(latency_case, "p99", handoff.LABELS[ring], baseline)
    for ring in rings:
        for baseline in baselines:
            report.compare(throughput_case, "throughput", handoff.LABELS[ring], baseline, target=5.0)
    report.note(f"latency p50/p99 are medians over {sizes['handoff_rounds']} rounds of "
                f"{sizes['latency_batches']} batches each; throughput is the median of the rounds")
    report.note("consumer CPU: the consumer process's CPU time over wall time during the latency run "
                "(a waiter that spins trades CPU for latency); wanted: the time its receiving thread was "
                "running or waiting for a CPU (/proc schedstat), which on a busy machine shows a spinning "
                "waiter that yields the CPU it did not get")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The benchmark's options (shared by the script and ``python -m tensorxfer bench``)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke test)")
    parser.add_argument("--out", default="bench/results", help="directory for JSON and PNG (default: %(default)s)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)} (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per variant (pack, copy)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the handoff measurements")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Runs the selected cases, prints the table, writes JSON and PNG; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown or not cases:
        print(f"--cases: expected a subset of {', '.join(CASES)}, got {args.cases!r}", file=sys.stderr)
        return 2
    sizes = dict(QUICK if args.quick else FULL)
    if args.repeats is not None:
        if args.repeats < 1:
            print(f"--repeats must be >= 1, got {args.repeats}", file=sys.stderr)
            return 2
        sizes["repeats"] = args.repeats
    if args.rounds is not None:
        if args.rounds < 1:
            print(f"--rounds must be >= 1, got {args.rounds}", file=sys.stderr)
            return 2
        sizes["handoff_rounds"] = args.rounds
    machine = machine_info()
    title = f"tensorxfer replay benchmark on {machine['cpu_model']} ({machine['cpus']} CPUs)"
    report = Report(title + (" (quick)" if args.quick else ""),
                    config={"quick": args.quick, "cases": cases, **sizes})
    runners = {"pack": bench_pack, "copy": bench_copy, "device_copy": bench_device_copy,
               "handoff": bench_handoff}
    for case in cases:
        print(f"running {case} ...", file=sys.stderr, flush=True)
        runners[case](report, sizes)
    json_path, png_path = report.write(args.out, "bench_replay" + ("_quick" if args.quick else ""))
    print(report.table())
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
