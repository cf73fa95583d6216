"""Hours of load with flat memory (issue 39): the replay pipeline with local and remote collectors,
a persistent-plan refit every 100 ms, all_reduce of every size through the "tensorxfer"
torch.distributed backend, and a collector SIGKILLed and restarted every minute.

    python tests/python/soak/soak.py --minutes 60          # (tests/python/soak/test_soak.py: stress tier)

Every ``--sample-seconds`` it samples each process's RSS and open file descriptors (by role: the
learner, its relay host and relays, each collector, each rank) and the soak's segments in
/dev/shm. It fails (exit 1) on growth past the bounds of ``soak_report`` between the first
sample after the warm-up and the last; on any batch lost (a gap in a collector incarnation's
sequence, or fewer batches than a local collector counted published) or corrupted (a byte
that differs from the store); on a rank's failed refit or all_reduce; on a loss reported for
a producer that was not killed; and on any soak segment left in /dev/shm at the end. The
samples are printed as a table and written as JSON, and as a PNG where matplotlib is installed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import soak_report  # noqa: E402
from soak_report import Sample  # noqa: E402
from soak_roles import split_tick  # noqa: E402

from tensorxfer.demo import store as replay_store  # noqa: E402

OBS_DIM, BATCH_ROWS, STORE_ROWS, SEED = 64, 64, 8192, 39
_OWN_SHM = 'mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && exec "$0" "$@"'


class Worker:
    """One role's current process (a killed collector comes back as the next incarnation)."""

    def __init__(self, soak: "Soak", role: str, kind: str, spec: Dict[str, Any]) -> None:
        self.soak, self.role, self.kind, self.spec = soak, role, kind, spec
        self.incarnation = -1
        self.process: Optional[subprocess.Popen] = None
        self.counters: Dict[int, str] = {}  # incarnation -> its publish counter file (local collectors)

    def start(self) -> None:
        self.incarnation += 1
        spec = dict(self.spec, incarnation=self.incarnation)
        if self.kind == "local":
            spec["counter"] = os.path.join(self.soak.tmp, f"{self.role}-{self.incarnation}.count")
            np.zeros(1, dtype=np.int64).tofile(spec["counter"])
            self.counters[self.incarnation] = spec["counter"]
        command = [sys.executable, os.path.join(HERE, "soak_roles.py"), self.kind, json.dumps(spec)]
        if self.kind == "remote" and self.soak.isolate:  # its own /dev/shm: a host of its own
            command = ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", _OWN_SHM, *command]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        self.soak.pids.add(self.process.pid)

    def kill_and_restart(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.soak.killed.append((time.monotonic(), self.role, self.incarnation))
        self.start()


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        from tensorxfer.ipc import SlotRing
        from tensorxfer.ipc.remote import RemoteProducers

        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="tensorxfer-soak-")
        self.stop_file = os.path.join(self.tmp, "stop")
        self.isolate = os.geteuid() == 0 and shutil.which("unshare") is not None
        self.pids = {os.getpid()}
        self.killed: List[Any] = []
        self.layout = replay_store.batch_layout(OBS_DIM, BATCH_ROWS)
        self.store = replay_store.ReplayStore.create(STORE_ROWS, OBS_DIM, SEED)
        self.ring = SlotRing.create(depth=8, slot_nbytes=replay_store.PAYLOAD_OFFSET + self.layout.nbytes)
        self.remote = RemoteProducers.serve(self.ring, "tcp://127.0.0.1:0", credits=2, timeout=10.0)
        # (collector, incarnation) -> batches received; each incarnation's sequences must arrive 0, 1, 2, ...
        # (counts, not lists: the learner's own bookkeeping must not grow with the batches).
        self.received: Dict[tuple, int] = {}
        self.out_of_order: List[str] = []  # the first few breaks of that order
        self.corrupt: List[str] = []
        self.losses: List[str] = []
        self.samples: List[Sample] = []
        self.batches = 0
        self.started = time.monotonic()
        store_handles = base64.b64encode(pickle.dumps(self.store.handles)).decode()  # picklable, not JSON
        common = {"stop": self.stop_file, "seed": SEED, "obs_dim": OBS_DIM, "batch_rows": BATCH_ROWS,
                  "store_rows": STORE_ROWS, "pause_s": args.pause_ms / 1000}
        self.collectors = [
            Worker(self, "local-0", "local", dict(common, collector=0, ring=self.ring.name, store=store_handles)),
            Worker(self, "remote-2", "remote", dict(common, collector=2, init_method=self.remote.init_method)),
            Worker(self, "local-1", "local", dict(common, collector=1, ring=self.ring.name, store=store_handles)),
            Worker(self, "remote-3", "remote", dict(common, collector=3, init_method=self.remote.init_method)),
        ]
        rendezvous = os.path.join(self.tmp, "rendezvous")
        self.ranks = [Worker(self, f"rank-{rank}", "rank",
                             {"rank": rank, "rendezvous": rendezvous, "stop": self.stop_file, "refit_ms": 100,
                              "status": os.path.join(self.tmp, f"rank-{rank}.json")}) for rank in (0, 1)]

    # ---- the learner ---------------------------------------------------------------------------------

    def consume(self, deadline: float) -> None:
        from tensorxfer.errors import PeerLostError

        next_kill = time.monotonic() + self.args.kill_seconds
        victim = 0
        payload = slice(replay_store.PAYLOAD_OFFSET, replay_store.PAYLOAD_OFFSET + self.layout.nbytes)
        while time.monotonic() < deadline:
            if time.monotonic() >= next_kill:
                self.collectors[victim % len(self.collectors)].kill_and_restart()
                victim += 1
                next_kill += self.args.kill_seconds
            for rank in self.ranks:
                if rank.process is not None and rank.process.poll() is not None:
                    raise RuntimeError(f"{rank.role} exited with {rank.process.returncode}: {self.rank_status(rank)}")
            try:
                slot, tick = self.ring.acquire_ready(timeout=0.5)
            except TimeoutError:
                continue
            except PeerLostError as error:
                self.losses.append(str(error))
                continue
            try:
                self.check(self.ring.slot_array(slot), tick, payload)
            finally:
                self.ring.release(slot)

    def check(self, view: np.ndarray, tick: int, payload: slice) -> None:
        collector, incarnation, sequence = split_tick(tick)
        header = view[: replay_store.PAYLOAD_OFFSET].view(np.int64)
        indices = replay_store.batch_indices(SEED, tick, BATCH_ROWS, STORE_ROWS)
        try:
            if header[replay_store.HEADER_MAGIC] != replay_store.HEADER_MAGIC_VALUE or header[0] != tick:
                raise replay_store.BatchMismatch(f"tick {tick}: header {header[:5].tolist()}")
            replay_store.verify_batch(self.layout.unpack(view[payload]), self.store.arrays, indices, tick)
        except replay_store.BatchMismatch as error:
            if len(self.corrupt) < 100:
                self.corrupt.append(str(error))
        key = (collector, incarnation)
        expected = self.received.get(key, 0)
        if sequence != expected and len(self.out_of_order) < 10:
            self.out_of_order.append(f"collector {collector} incarnation {incarnation}: sequence {sequence} arrived "
                                     f"after {expected} batches (lost or out of order)")
        self.received[key] = expected + 1
        self.batches += 1

    # ---- sampling -------------------------------------------------------------------------------------

    def roles(self) -> Dict[str, List[int]]:
        roles: Dict[str, List[int]] = {"learner": [os.getpid()]}
        for worker in self.collectors + self.ranks:
            if worker.process is not None and worker.process.poll() is None:
                roles[worker.role] = [worker.process.pid]
        workers = {worker.process.pid for worker in self.collectors + self.ranks if worker.process is not None}
        host, relays = [], []
        for pid in soak_report.descendants(os.getpid()):
            if pid in workers:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    command = cmdline.read()
            except OSError:
                continue
            if b"relay_host_main" in command:  # the host is the learner's child, relays are the host's
                (host if self._parent(pid) == os.getpid() else relays).append(pid)
        roles["relay-host"], roles["relays"] = host, relays
        return roles

    @staticmethod
    def _parent(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return -1

    def sample(self) -> Sample:
        sample = Sample(seconds=time.monotonic() - self.started, batches=self.batches)
        for role, pids in self.roles().items():
            self.pids.update(pids)
            rss = [value for value in map(soak_report.process_rss_mib, pids) if value is not None]
            fds = [value for value in map(soak_report.process_fds, pids) if value is not None]
            if rss and fds:  # a collector between its kill and its restart has none
                sample.rss_mib[role], sample.fds[role] = sum(rss), sum(fds)
        names = soak_report.soak_segments(self.pids, "tensorxfer-group-")
        sample.shm_segments, sample.shm_mib = len(names), soak_report.shm_usage_mib(names)
        return sample

    def sampler(self, stop: threading.Event) -> None:
        while True:
            self.samples.append(self.sample())
            print(f"[soak {self.samples[-1].seconds / 60:5.1f} min] {self.batches} batches, "
                  f"{len(self.killed)} kills, {len(self.corrupt)} corrupt", flush=True)
            if stop.wait(self.args.sample_seconds):
                return

    def rank_status(self, rank: Worker) -> Dict[str, Any]:
        try:
            with open(rank.spec["status"]) as status:
                return json.load(status)
        except (OSError, ValueError):
            return {}

    # ---- the run ------------------------------------------------------------------------------------

    def run(self) -> int:
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=self.sampler, args=(stop_sampling,), daemon=True)
        failures: List[str] = []
        try:
            for worker in self.ranks + self.collectors:
                worker.start()
            self.remote.wait_for_producers(2, timeout=120)
            sampler.start()
            self.consume(self.started + self.args.minutes * 60)
        except Exception as error:  # noqa: BLE001 - reported with the rest
            failures.append(f"the soak stopped early: {type(error).__name__}: {error}")
        finally:
            failures += self.shut_down(stop_sampling, sampler)
        failures += self.verdict()
        print(soak_report.table(self.samples))
        for path in soak_report.write(self.samples, self.args.out):
            print(f"wrote {path}")
        print(f"soak: {self.args.minutes:g} min, {self.batches} batches checked, {len(self.killed)} collectors "
              f"SIGKILLed and restarted, refits {[self.rank_status(r).get('refits') for r in self.ranks]}, "
              f"all_reduces {[self.rank_status(r).get('all_reduces') for r in self.ranks]}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        for failure in failures:
            print(f"FAILED: {failure}")
        print("soak PASSED" if not failures else "soak FAILED")
        return 0 if not failures else 1

    def shut_down(self, stop_sampling: threading.Event, sampler: threading.Thread) -> List[str]:
        failures: List[str] = []
        stop_sampling.set()
        if sampler.is_alive():
            sampler.join(30)
        self.samples.append(self.sample())  # the last one under load
        open(self.stop_file, "w").close()
        deadline = time.monotonic() + 60
        for worker in self.ranks + self.collectors:
            if worker.process is None:
                continue
            # Collectors may wait for a credit: drain the ring meanwhile so that they can leave.
            while worker.process.poll() is None and time.monotonic() < deadline:
                self.drain()
            if worker.process.poll() is None:
                worker.process.kill()
                failures.append(f"{worker.role} did not stop within 60 s")
            worker.process.wait()
            if worker.kind == "rank" and worker.process.returncode != 0:
                failures.append(f"{worker.role} exited with {worker.process.returncode}: {self.rank_status(worker)}")
        self.drain()
        self.remote.close()
        self.ring.close()
        self.store.close()
        return failures

    def drain(self) -> None:
        from tensorxfer.errors import PeerLostError

        payload = slice(replay_store.PAYLOAD_OFFSET, replay_store.PAYLOAD_OFFSET + self.layout.nbytes)
        try:
            slot, tick = self.ring.acquire_ready(timeout=0.05)
        except (TimeoutError, PeerLostError):
            return
        try:
            self.check(self.ring.slot_array(slot), tick, payload)
        finally:
            self.ring.release(slot)

    def verdict(self) -> List[str]:
        failures = [f"corrupted batch: {text}" for text in self.corrupt[:5]]
        failures += self.out_of_order
        for worker in self.collectors:
            for incarnation, path in worker.counters.items():
                published = int(np.fromfile(path, dtype=np.int64)[0])
                got = self.received.get((worker.spec["collector"], incarnation), 0)
                if got < published:
                    failures.append(f"{worker.role} incarnation {incarnation} published {published} batches, "
                                    f"the learner got {got}")
        killed_remote = {f"'collector-{role.split('-')[1]}'" for _, role, _ in self.killed if role.startswith("remote")}
        for message in self.losses:
            if not any(name in message for name in killed_remote):
                failures.append(f"a loss nobody caused: {message}")
        for rank in self.ranks:
            status = self.rank_status(rank)
            if status.get("error") or not status.get("refits") or not status.get("all_reduces"):
                failures.append(f"{rank.role}: {status}")
        failures += soak_report.check_growth(self.samples, self.args.warmup_minutes * 60)
        # Segments of SIGKILLed processes are swept by the next create() (shm_segment.h): one here.
        from tensorxfer.ipc import SharedArray

        SharedArray.create((1,), np.uint8).close()
        leftovers = soak_report.soak_segments(self.pids, "tensorxfer-group-")
        if leftovers:
            failures.append(f"segments left in /dev/shm: {leftovers}")
        return failures


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load (default %(default)s)")
    parser.add_argument("--sample-seconds", type=float, default=60.0, help="sampling interval (default %(default)s)")
    parser.add_argument("--kill-seconds", type=float, default=60.0,
                        help="a collector is SIGKILLed and restarted this often (default %(default)s)")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="growth is measured from the first sample after this (default: 2, or a fifth of a "
                             "shorter run)")
    parser.add_argument("--pause-ms", type=float, default=5.0, help="each collector's pause between batches")
    parser.add_argument("--out", default=os.path.join("build", "soak"), help="where samples.json and soak.png go")
    args = parser.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(2.0, args.minutes / 5)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
