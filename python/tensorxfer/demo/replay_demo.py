"""Replay pipeline demo: collectors pack seeded batches into a SlotRing, a learner moves and checks them.

A replay store (one ``SharedArray`` per field) lives in shared memory.  Two or
more collector processes (spawn) each sample seeded row indices per tick, pack
the rows with ``pack_rows`` into a free ring slot and publish it.  With
``--remote-collectors N``, N more collectors run as other hosts (each in its own
IPC and mount namespaces with its own ``/dev/shm`` when this runs as root, else
plain processes) and feed the same ring over torch.distributed
(``tensorxfer.ipc.remote``), each from its own copy of the store.  The learner
takes each batch with ``acquire_ready``, copies it into a device slot through
the backend from ``build_replay_transfer_backend``, computes on the previous
batch while the copy runs, and checks every batch against the store.

Run it as ``python -m tensorxfer demo`` or ``python examples/replay_pipeline.py``.
Exit codes: 0 success, 1 a batch did not match the store, 2 bad options,
3 the pipeline failed (a collector died, a stall, a device error), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from tensorxfer.demo import store as replay_store
from tensorxfer.demo.collector import CollectorConfig, run_collector
from tensorxfer.demo.learner import Learner, LearnerStats, percentiles_us
from tensorxfer.errors import PeerLostError, UnsupportedError

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
_START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 10.0


@dataclasses.dataclass
class DemoOptions:
    """Every demo option; the defaults finish in about 30 s on a 2-core machine."""

    seconds: float = 25.0
    batches: Optional[int] = None
    collectors: int = 2
    remote_collectors: int = 0
    batch_rows: int = 512
    device: str = "cpu"
    ring_depth: int = 4
    seed: int = 0
    store_rows: int = 65536
    obs_dim: int = 256
    stall_timeout: float = 10.0
    json: bool = False

    def validate(self) -> None:
        """Raises ValueError naming the first option that is out of range."""
        local_needed = 2 if self.remote_collectors == 0 else 0
        checks = [("--seconds", self.seconds, self.seconds > 0, "> 0"),
                  ("--collectors", self.collectors, self.collectors >= local_needed, f">= {local_needed}"),
                  ("--remote-collectors", self.remote_collectors, self.remote_collectors >= 0, ">= 0"),
                  ("--batch-rows", self.batch_rows, self.batch_rows >= 1, ">= 1"),
                  ("--ring-depth", self.ring_depth, self.ring_depth >= 2, ">= 2"),
                  ("--store-rows", self.store_rows, self.store_rows >= 1, ">= 1"),
                  ("--obs-dim", self.obs_dim, self.obs_dim >= 1, ">= 1"),
                  ("--seed", self.seed, self.seed >= 0, ">= 0"),
                  ("--stall-timeout", self.stall_timeout, self.stall_timeout > 0, "> 0")]
        if self.batches is not None:
            checks.append(("--batches", self.batches, self.batches >= 1, ">= 1"))
        for flag, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"{flag} must be {expected}, got {value}")


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    """The demo's command-line options (shared by the example script and the CLI)."""
    defaults = DemoOptions()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=float, default=defaults.seconds, help="how long the learner runs (default %(default)s)")
    add("--batches", type=int, default=None, help="stop after this many batches (default: time only)")
    add("--collectors", type=int, default=defaults.collectors, help="collector processes (default %(default)s)")
    add("--remote-collectors", type=int, default=defaults.remote_collectors,
        help="collectors on simulated other hosts, over torch.distributed (default %(default)s)")
    add("--batch-rows", type=int, default=defaults.batch_rows, help="rows per batch (default %(default)s)")
    add("--device", default=defaults.device, help="learner device, e.g. cpu, cuda:0, xpu, mps (default %(default)s)")
    add("--ring-depth", type=int, default=defaults.ring_depth, help="host and device slots (default %(default)s)")
    add("--seed", type=int, default=defaults.seed, help="base seed of the store and the samples (default %(default)s)")
    add("--store-rows", type=int, default=defaults.store_rows, help="rows in the replay store (default %(default)s)")
    add("--obs-dim", type=int, default=defaults.obs_dim, help="float32 values per observation (default %(default)s)")
    add("--stall-timeout", type=float, default=defaults.stall_timeout,
        help="fail when no batch arrives for this many seconds (default %(default)s)")
    add("--json", action="store_true", help="print the summary as JSON")
    return parser


class DemoUsageError(ValueError):
    """An option the demo cannot use (reported with exit code 2)."""


class _Collectors:
    """The collector processes: start, wait until ready, watch, stop (always, even on errors)."""

    def __init__(self, context: Any, configs: Sequence[CollectorConfig]) -> None:
        self.stop_event = context.Event()
        self.ready = [context.Event() for _ in configs]
        self.processes = [context.Process(target=run_collector, args=(config, ready, self.stop_event),
                                          name=f"tensorxfer-demo-collector-{config.collector_id}", daemon=True)
                          for config, ready in zip(configs, self.ready)]
        self.stopping = False

    def start(self) -> None:
        """Starts every collector and waits until each has attached (or one died)."""
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        for ready in self.ready:
            while not ready.wait(0.05):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"collectors did not start within {_START_TIMEOUT_S:g} s")

    def check_alive(self) -> None:
        """Raises PeerLostError naming the first collector that exited while it should be running."""
        for index, process in enumerate(self.processes):
            if process.exitcode is not None and not self.stopping:
                raise PeerLostError(f"collector {index} (pid {process.pid}) exited with code {process.exitcode}; "
                               "the learner cannot go on without it")

    @property
    def pids(self) -> List[int]:
        """Process ids of the collectors (after start)."""
        return [process.pid for process in self.processes]

    def stop(self) -> None:
        """Asks every collector to stop, waits for it, kills one that does not exit in time."""
        self.stopping = True
        self.stop_event.set()
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for process in self.processes:
            if process.pid is None:
                continue
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()


def run_demo(options: DemoOptions, *, on_started: Optional[Callable[[List[int]], None]] = None,
             on_batch: Optional[Callable[[LearnerStats], None]] = None,
             backend_factory: Optional[Callable[..., Any]] = None) -> dict:
    """Runs the pipeline; returns the summary dict.  Raises BatchMismatch, PeerLostError, TimeoutError.

    ``on_started(collector_pids)`` runs once every collector is ready;
    ``on_batch(stats)`` after every batch (progress display);
    ``backend_factory(device=..., ring_depth=...)`` builds the transfer backend
    (default ``build_replay_transfer_backend``).  The host backend gets numpy
    slots, any other backend torch tensors.  Every shared segment is released
    and every collector stopped before this returns or raises.
    """
    options.validate()
    from tensorxfer.ipc import SlotRing
    from tensorxfer.ipc.replay_pipelines.transfer import HostReplayTransferBackend, build_replay_transfer_backend

    backend_factory = backend_factory or build_replay_transfer_backend

    layout = replay_store.batch_layout(options.obs_dim, options.batch_rows)
    with contextlib.ExitStack() as cleanup:
        try:
            backend = backend_factory(device=options.device, ring_depth=options.ring_depth)
        except (ValueError, TypeError) as error:
            raise DemoUsageError(f"--device {options.device!r}: {error}") from error
        cleanup.callback(backend.close)
        store = cleanup.enter_context(replay_store.ReplayStore.create(options.store_rows, options.obs_dim,
                                                                      options.seed))
        ring = SlotRing.create(depth=options.ring_depth, slot_nbytes=replay_store.PAYLOAD_OFFSET + layout.nbytes)
        cleanup.callback(ring.close)
        cleanup.callback(backend.close)  # again (idempotent): unpin the ring's slots before the ring goes
        use_torch = not isinstance(backend, HostReplayTransferBackend)
        total = options.collectors + options.remote_collectors
        configs = [CollectorConfig(i, total, ring.handle, store.handles, options.obs_dim,
                                   options.batch_rows, options.seed) for i in range(options.collectors)]
        collectors = _Collectors(multiprocessing.get_context("spawn"), configs)
        remote = None
        if options.remote_collectors:
            from tensorxfer.demo.remote_hosts import RemoteCollectors

            remote = RemoteCollectors(ring, options, first_id=options.collectors)
            cleanup.callback(remote.stop)

        def alive() -> None:
            collectors.check_alive()
            if remote is not None:
                remote.check_alive()

        learner = Learner(ring=ring, store=store, backend=backend, layout=layout, seed=options.seed,
                          num_collectors=total, use_torch=use_torch, collectors_alive=alive,
                          first_remote=options.collectors)
        learner.calibrate_transfer()
        cleanup.callback(collectors.stop)
        # The remote collectors first: they take seconds to start and connect (and hold their
        # credits in the ring once they have), while the local ones fill the ring at once; in the
        # other order a short run under load was over before any remote batch arrived.
        if remote is not None:
            remote.start()
        collectors.start()
        if on_started is not None:
            on_started(collectors.pids + (remote.pids if remote is not None else []))
        stats = learner.run(seconds=options.seconds, max_batches=options.batches,
                            stall_timeout_s=options.stall_timeout, on_batch=on_batch)
        summary = summarize(stats, options, backend, layout.nbytes, store.nbytes)
        if remote is not None:
            summary["remote_hosts"] = remote.isolation
        return summary


def summarize(stats: LearnerStats, options: DemoOptions, backend: Any, batch_nbytes: int,
              store_nbytes: int) -> dict:
    """The end-of-run summary from the raw learner measurements."""
    import numpy as np

    elapsed = max(stats.elapsed_s, 1e-9)
    remote_batches = sum(stats.per_collector[options.collectors:])
    local_batches = stats.batches - remote_batches
    transfer_total = float(np.sum(stats.transfer_s)) if stats.transfer_s else 0.0
    hidden = None if transfer_total <= 0 else float(np.sum(stats.hidden_s)) / transfer_total
    return {
        "batches": stats.batches,
        "verified": stats.verified,
        "seconds": stats.elapsed_s,
        "batches_per_s": stats.batches / elapsed,
        "local_batches": local_batches,
        "local_batches_per_s": local_batches / elapsed,
        "remote_batches": remote_batches,
        "remote_batches_per_s": remote_batches / elapsed,
        "remote_handoff_latency_us": percentiles_us(stats.remote_handoff_ns),
        "gb_per_s": stats.batches * batch_nbytes / elapsed / 1e9,
        "batch_bytes": batch_nbytes,
        "store_bytes": store_nbytes,
        "handoff_latency_us": percentiles_us(stats.handoff_ns),
        "handoff_latency_waiting_us": {**percentiles_us(stats.waiting_handoff_ns),
                                       "batches": len(stats.waiting_handoff_ns)},
        "submit_cpu_us_p50": float(np.median(stats.submit_s)) * 1e6 if stats.submit_s else None,
        "transfer_ms_calibrated": stats.transfer_s_calibrated * 1e3,
        "exposed_wait_ms_p50": float(np.median(stats.exposed_wait_s)) * 1e3 if stats.exposed_wait_s else None,
        "exposed_wait_ms_total": float(np.sum(stats.exposed_wait_s)) * 1e3,
        "copies_done_before_compute_ended": int(sum(1 for e in stats.exposed_wait_s if e == 0.0)),
        "compute_ms_p50": float(np.median(stats.compute_s)) * 1e3 if stats.compute_s else None,
        "hidden_share": hidden,
        "device": options.device,
        "backend": type(backend).__name__,
        "host_pinned": bool(getattr(backend, "host_pinned", False)),
        "collectors": options.collectors,
        "remote_collectors": options.remote_collectors,
        "ring_depth": options.ring_depth,
        "batch_rows": options.batch_rows,
        "seed": options.seed,
        "checksum": stats.checksum,
    }


def format_summary(summary: dict) -> str:
    """The human-readable summary."""
    def number(value: Any, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    latency = summary["handoff_latency_us"]
    waiting = summary["handoff_latency_waiting_us"]
    hidden = summary["hidden_share"]
    return "\n".join([
        f"replay demo: {summary['verified']} of {summary['batches']} batches verified in {summary['seconds']:.1f} s "
        f"(device {summary['device']}, {summary['backend']}, {summary['collectors']} collectors, "
        f"ring depth {summary['ring_depth']}, {summary['batch_rows']} rows = {summary['batch_bytes'] / 1024:.1f} KiB "
        "per batch)",
        f"  throughput  {summary['batches_per_s']:.1f} batches/s, {summary['gb_per_s']:.3f} GB/s",
        *([f"              local {summary['local_batches_per_s']:.1f} batches/s ({summary['local_batches']} batches "
           f"from {summary['collectors']} collectors), remote {summary['remote_batches_per_s']:.1f} batches/s "
           f"({summary['remote_batches']} batches from {summary['remote_collectors']} collectors on "
           f"{summary.get('remote_hosts', 'other hosts')}; handoff p50 "
           f"{number(summary['remote_handoff_latency_us']['p50'], '.1f')} us)"]
          if summary["remote_collectors"] else []),
        f"  handoff     p50 {number(latency['p50'], '.1f')} us, p99 {number(latency['p99'], '.1f')} us "
        "(collector publish -> learner acquire_ready, including time queued in the ring)",
        *([f"              p50 {number(waiting['p50'], '.1f')} us, p99 {number(waiting['p99'], '.1f')} us for the "
           f"{waiting['batches']} batches published while the learner was already waiting"]
          if waiting["batches"] else []),
        f"  transfer    {summary['transfer_ms_calibrated']:.3f} ms per batch alone, submit "
        f"{number(summary['submit_cpu_us_p50'], '.1f')} us CPU, exposed wait p50 "
        f"{number(summary['exposed_wait_ms_p50'], '.3f')} ms",
        f"  overlap     {'n/a' if hidden is None else f'{hidden:.0%}'} of transfer time hidden behind compute; "
        f"{summary['copies_done_before_compute_ended']} of {summary['batches']} copies done before the compute "
        f"step ended (compute + verify p50 {number(summary['compute_ms_p50'], '.3f')} ms)",
    ])


class _Progress:
    """tqdm when installed and stderr is a terminal, else a plain status line; silent otherwise.

    The bar appears with the first batch, so collector start-up does not count in its rate.
    """

    def __init__(self, options: DemoOptions) -> None:
        self.enabled = sys.stderr.isatty()
        self.total = options.batches
        self.bar: Any = None
        self.shown = False
        self.last = 0.0

    def _make_bar(self) -> Any:
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        # A pseudo-terminal may report a 0 x 0 size; tqdm then draws nothing.
        columns, lines = shutil.get_terminal_size((80, 24))
        return tqdm(total=self.total, unit="batch", file=sys.stderr,
                    ncols=columns if columns > 0 else 80, nrows=lines if lines > 0 else 24)

    def __call__(self, stats: LearnerStats) -> None:
        if not self.enabled:
            return
        if not self.shown:
            self.shown = True
            self.bar = self._make_bar()
        if self.bar is not None:
            self.bar.update(stats.batches - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last >= 0.25:
            self.last = now
            sys.stderr.write(f"\r{stats.batches} batches, {stats.verified} verified")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.shown:
            sys.stderr.write("\n")


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Parses ``argv``, runs the demo, prints the summary; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    options = DemoOptions(**{field.name: getattr(args, field.name) for field in dataclasses.fields(DemoOptions)})
    try:
        options.validate()
    except ValueError as error:
        print(f"{prog or 'replay demo'}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    progress = _Progress(options)
    previous_sigterm = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C, so the collectors are stopped and the segments released.
        previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        summary = run_demo(options, on_batch=progress)
    except DemoUsageError as error:
        progress.close()
        print(f"{prog or 'replay demo'}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except UnsupportedError as error:
        progress.close()
        print(f"replay demo FAILED: {error}", file=sys.stderr)
        return EXIT_FAILED
    except replay_store.BatchMismatch as error:
        progress.close()
        print(f"replay demo FAILED: batch verification: {error}", file=sys.stderr)
        return EXIT_MISMATCH
    except (PeerLostError, TimeoutError) as error:
        progress.close()
        print(f"replay demo FAILED: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        progress.close()
        print("replay demo interrupted; shared memory released", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
    progress.close()
    print(json.dumps(summary, indent=2) if options.json else format_summary(summary))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
