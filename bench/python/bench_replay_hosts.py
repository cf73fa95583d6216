"""Remote collectors into one learner's ring across simulated hosts, against the floors.

For 1, 2 and 4 remote collectors (each in its own simulated host: own IPC and mount
namespaces and /dev/shm, TCP between them) and 64 KiB, 1 MiB and 4 MiB slots, in the same
run and between the same hosts, interleaved run by run:

* ``ring``    ``RemoteSlotRing.publish`` -> the learner's ``SlotRing.acquire_ready`` (tensorxfer.ipc.remote);
* ``engine``  the engine's floor: a hand-written torch.distributed (gloo) isend/irecv loop, same bytes,
              same window of 2 messages in flight per collector;
* ``socket``  the link's floor: raw TCP ``sendall`` / ``recv_into``;
* ``pickle``  numpy arrays pickled over ``multiprocessing.connection`` (TCP), what RL code writes by hand;
* ``zmq``     pyzmq PUSH/PULL with ``copy=False`` (only when pyzmq is importable).

At 64 KiB with one collector it also measures the p50 latency from ``publish`` to
``acquire_ready`` against one raw-socket round trip (64 KiB there, 8 bytes back), and the
engine's own floor beside it: a gloo message one way (send to the waiting receiver's
wake-up) and a gloo round trip, receives posted ahead as the ring posts them.

Needs root (simulated hosts) and torch.  Run it under the CPU lock on shared machines::

    flock /tmp/tensorxfer-cpu.lock python bench/python/bench_replay_hosts.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

METHODS = ["ring", "engine", "socket", "pickle", "zmq"]
CREDITS = 2
LATENCY_SAMPLES = 300


def zmq_available() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


# ---- coordination (both sides) -----------------------------------------------------------------


class Coordinator:
    """The workers' own TCPStore: barriers and addresses (never timed)."""

    def __init__(self, port: int, serve: bool, world: int) -> None:
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", port, is_master=serve, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=300))
        self.world = world

    def barrier(self, name: str) -> None:
        self.store.add(f"barrier/{name}", 1)
        while int(self.store.add(f"barrier/{name}", 0)) < self.world:
            time.sleep(0.0005)

    def publish(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def lookup(self, key: str) -> str:
        return self.store.get(key).decode()


def slots_per_collector(size: int, collectors: int, mib: int) -> int:
    return max(16, (mib << 20) // (size * collectors))


# ---- receiver (the learner's host) ------------------------------------------------------------------


def receive_case(co: Coordinator, case: str, method: str, size: int, collectors: int, count: int) -> float:
    """Seconds from the start barrier until every collector's ``count`` slots have arrived."""
    if method == "ring":
        from tensorxfer.ipc import SlotRing
        from tensorxfer.ipc.remote import RemoteProducers

        with SlotRing.create(depth=CREDITS * collectors + 2, slot_nbytes=size) as ring:
            remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=CREDITS, timeout=60.0, key=case)
            co.publish(f"{case}/address", remote.init_method)
            remote.wait_for_producers(collectors, timeout=120.0)
            co.barrier(f"{case}/start")
            begin = time.perf_counter()
            for _ in range(collectors * count):
                slot, _tick = ring.acquire_ready(timeout=60.0)
                ring.release(slot)
            elapsed = time.perf_counter() - begin
            co.barrier(f"{case}/end")
            remote.close()
        return elapsed
    if method == "engine":
        import torch
        import torch.distributed as dist

        groups = [dist.ProcessGroupGloo(dist.PrefixStore(f"{case}/engine/{index}/", co.store), 0, 2,
                                        datetime.timedelta(seconds=120)) for index in range(collectors)]
        buffers = [[torch.empty(size, dtype=torch.uint8) for _ in range(CREDITS)] for _ in range(collectors)]
        co.barrier(f"{case}/start")
        begin = time.perf_counter()
        posted = [[group.recv([buffers[index][k]], 1, 0) for k in range(min(CREDITS, count))]
                  for index, group in enumerate(groups)]
        for k in range(count):
            for index, group in enumerate(groups):
                posted[index].pop(0).wait()
                if k + CREDITS < count:
                    posted[index].append(group.recv([buffers[index][k % CREDITS]], 1, 0))
        elapsed = time.perf_counter() - begin
        co.barrier(f"{case}/end")
        return elapsed
    if method == "socket":
        server = socket.create_server(("127.0.0.1", 0))
        co.publish(f"{case}/address", str(server.getsockname()[1]))
        connections = [server.accept()[0] for _ in range(collectors)]

        def drain(connection: socket.socket) -> None:
            buffer = memoryview(bytearray(size))
            for _ in range(count):
                got = 0
                while got < size:
                    got += connection.recv_into(buffer[got:], size - got)

        return _timed_threads(co, case, [lambda c=c: drain(c) for c in connections], cleanup=connections + [server])
    if method == "pickle":
        listener = Listener(("127.0.0.1", 0))
        co.publish(f"{case}/address", str(listener.address[1]))
        connections = [listener.accept() for _ in range(collectors)]

        def unpickle(connection: Any) -> None:
            for _ in range(count):
                connection.recv()

        elapsed = _timed_threads(co, case, [lambda c=c: unpickle(c) for c in connections], cleanup=connections)
        listener.close()
        return elapsed
    if method == "zmq":
        import zmq

        context = zmq.Context()
        pull = context.socket(zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        co.publish(f"{case}/address", str(port))
        co.barrier(f"{case}/start")
        begin = time.perf_counter()
        for _ in range(collectors * count):
            pull.recv(copy=False)
        elapsed = time.perf_counter() - begin
        co.barrier(f"{case}/end")
        pull.close(linger=0)
        context.term()
        return elapsed
    raise ValueError(method)


def _timed_threads(co: Coordinator, case: str, bodies: List[Any], cleanup: List[Any]) -> float:
    threads = [threading.Thread(target=body) for body in bodies]
    co.barrier(f"{case}/start")
    begin = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - begin
    co.barrier(f"{case}/end")
    for item in cleanup:
        item.close()
    return elapsed


def send_case(co: Coordinator, case: str, method: str, size: int, index: int, count: int) -> None:
    if method == "ring":
        from tensorxfer.ipc.remote import RemoteSlotRing

        producer = RemoteSlotRing.connect(co.lookup(f"{case}/address"), name=f"bench-{index}", timeout=60.0, key=case)
        co.barrier(f"{case}/start")
        for k in range(count):
            slot = producer.acquire_free(timeout=60.0)
            producer.publish(slot, k)
        co.barrier(f"{case}/end")
        producer.close()
    elif method == "engine":
        import torch
        import torch.distributed as dist

        group = dist.ProcessGroupGloo(dist.PrefixStore(f"{case}/engine/{index}/", co.store), 1, 2,
                                      datetime.timedelta(seconds=120))
        buffers = [torch.zeros(size, dtype=torch.uint8) for _ in range(CREDITS)]
        co.barrier(f"{case}/start")
        works: List[Any] = []
        for k in range(count):
            works.append(group.send([buffers[k % CREDITS]], 0, 0))
            if len(works) >= CREDITS:
                works.pop(0).wait()
        for work in works:
            work.wait()
        co.barrier(f"{case}/end")
    elif method == "socket":
        connection = socket.create_connection(("127.0.0.1", int(co.lookup(f"{case}/address"))))
        payload = bytes(size)
        co.barrier(f"{case}/start")
        for _ in range(count):
            connection.sendall(payload)
        co.barrier(f"{case}/end")
        connection.close()
    elif method == "pickle":
        connection = Client(("127.0.0.1", int(co.lookup(f"{case}/address"))))
        array = np.zeros(size, dtype=np.uint8)
        co.barrier(f"{case}/start")
        for _ in range(count):
            connection.send(array)
        co.barrier(f"{case}/end")
        connection.close()
    elif method == "zmq":
        import zmq

        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{co.lookup(f'{case}/address')}")
        array = np.zeros(size, dtype=np.uint8)
        co.barrier(f"{case}/start")
        for _ in range(count):
            push.send(array, copy=False)
        co.barrier(f"{case}/end")
        push.close(linger=-1)
        context.term()


# ---- latency (one collector, 64 KiB) ----------------------------------------------------------------


def receive_latency(co: Coordinator, size: int) -> Dict[str, float]:
    from tensorxfer.ipc import SlotRing
    from tensorxfer.ipc.remote import RemoteProducers

    with SlotRing.create(depth=CREDITS + 2, slot_nbytes=size) as ring:
        remote = RemoteProducers.serve(ring, "tcp://127.0.0.1:0", credits=CREDITS, timeout=60.0, key="latency")
        co.publish("latency/address", remote.init_method)
        co.barrier("latency/start")
        samples = []
        for _ in range(LATENCY_SAMPLES):
            slot, _tick = ring.acquire_ready(timeout=60.0)
            stamp = int(ring.slot_array(slot)[:8].view(np.int64)[0])
            samples.append(time.monotonic_ns() - stamp)
            ring.release(slot)
        co.barrier("latency/end")
        remote.close()
    server = socket.create_server(("127.0.0.1", 0))
    co.publish("latency/socket", str(server.getsockname()[1]))
    connection = server.accept()[0]
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = memoryview(bytearray(size))
    for _ in range(LATENCY_SAMPLES):
        got = 0
        while got < size:
            got += connection.recv_into(buffer[got:], size - got)
        connection.sendall(b"\0" * 8)
    rtts = [float(x) for x in json.loads(co.lookup("latency/rtts"))]
    connection.close()
    server.close()
    gloo_rtts, gloo_one_way = receive_gloo_latency(co, size)
    return {"ring_p50_us": statistics.median(samples) / 1e3, "socket_rtt_p50_us": statistics.median(rtts) / 1e3,
            "gloo_rtt_p50_us": statistics.median(gloo_rtts) / 1e3,
            "gloo_one_way_p50_us": statistics.median(gloo_one_way) / 1e3}


def receive_gloo_latency(co: Coordinator, size: int) -> Tuple[List[float], List[float]]:
    """The engine's own latency floor between the same hosts, receives posted ahead as the ring's are:
    a round trip (``size`` bytes there, 8 back) and one way (send to the waiting receiver's wake)."""
    import torch
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.PrefixStore("latency/gloo/", co.store), 0, 2, datetime.timedelta(seconds=120))
    data, ack = torch.empty(size, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64)
    one_way = []
    for tag in (1, 2):  # 1: round trips, 2: one way
        posted = group.recv([data], 1, tag)
        co.barrier(f"latency/gloo/{tag}")
        for k in range(LATENCY_SAMPLES):
            posted.wait()
            stamp = int(data[:8].numpy().view(np.int64)[0])
            if tag == 2:
                one_way.append(time.monotonic_ns() - stamp)
            if k + 1 < LATENCY_SAMPLES:
                posted = group.recv([data], 1, tag)
            if tag == 1:
                group.send([ack], 1, 3).wait()
    rtts = [float(x) for x in json.loads(co.lookup("latency/gloo_rtts"))]
    co.barrier("latency/gloo/end")
    return rtts, [float(x) for x in one_way]


def send_gloo_latency(co: Coordinator, size: int) -> None:
    import torch
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.PrefixStore("latency/gloo/", co.store), 1, 2, datetime.timedelta(seconds=120))
    data, ack = torch.zeros(size, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64)
    stamp = data[:8].numpy().view(np.int64)
    rtts = []
    for tag in (1, 2):
        co.barrier(f"latency/gloo/{tag}")
        for _ in range(LATENCY_SAMPLES):
            time.sleep(0.002)  # the receiver is waiting when each message comes
            begin = time.monotonic_ns()
            stamp[0] = begin
            sent = group.send([data], 0, tag)
            if tag == 1:
                group.recv([ack], 0, 3).wait()
                rtts.append(time.monotonic_ns() - begin)
            sent.wait()
    co.publish("latency/gloo_rtts", json.dumps(rtts))
    co.barrier("latency/gloo/end")


def send_latency(co: Coordinator, size: int) -> None:
    from tensorxfer.ipc.remote import RemoteSlotRing

    producer = RemoteSlotRing.connect(co.lookup("latency/address"), name="latency", timeout=60.0, key="latency")
    co.barrier("latency/start")
    for k in range(LATENCY_SAMPLES):
        time.sleep(0.002)  # the learner is waiting when each slot comes
        slot = producer.acquire_free(timeout=60.0)
        producer.slot_array(slot)[:8].view(np.int64)[0] = time.monotonic_ns()
        producer.publish(slot, k)
    co.barrier("latency/end")
    producer.close()
    connection = socket.create_connection(("127.0.0.1", int(co.lookup("latency/socket"))))
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, ack = bytes(size), bytearray(8)
    rtts = []
    for _ in range(LATENCY_SAMPLES):
        time.sleep(0.002)
        begin = time.monotonic_ns()
        connection.sendall(payload)
        got = 0
        while got < 8:
            got += connection.recv_into(memoryview(ack)[got:], 8 - got)
        rtts.append(time.monotonic_ns() - begin)
    co.publish("latency/rtts", json.dumps(rtts))
    connection.close()
    send_gloo_latency(co, size)


# ---- worker entry ------------------------------------------------------------------------------------


def worker(role: str, index: int, collectors: int, port: int, plan: Dict[str, Any]) -> None:
    co = Coordinator(port, serve=role == "receiver", world=collectors + 1)
    results: Dict[str, Any] = {"cases": []}
    for run in range(plan["runs"]):
        for size in plan["sizes"]:
            count = slots_per_collector(size, collectors, plan["mib"])
            for method in plan["methods"]:
                case = f"r{run}-s{size}-{method}"
                if role == "receiver":
                    elapsed = receive_case(co, case, method, size, collectors, count)
                    results["cases"].append({"run": run, "size": size, "method": method, "seconds": elapsed,
                                             "gb_per_s": collectors * count * size / elapsed / 1e9})
                else:
                    send_case(co, case, method, size, index, count)
    if collectors == 1 and plan["latency"]:
        if role == "receiver":
            results["latency"] = receive_latency(co, 64 << 10)
        else:
            send_latency(co, 64 << 10)
    co.barrier("done")
    if role == "receiver":
        Path(plan["result"]).write_text(json.dumps(results))
        while int(co.store.add("left", 0)) < collectors:  # the store goes with us: wait until nobody reads it
            time.sleep(0.001)
    else:
        co.store.add("left", 1)


# ---- launcher ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_collectors(collectors: int, plan: Dict[str, Any], tmp: Path) -> Dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
    from simulated_hosts import SimulatedHosts

    import tensorxfer

    package_root = str(Path(tensorxfer.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    port = free_port()
    plan = dict(plan, result=str(tmp / f"result-{collectors}.json"))
    script = str(Path(__file__).resolve())
    with SimulatedHosts([1] * (collectors + 1)) as hosts:
        processes = [subprocess.Popen(hosts.enter(host) + [sys.executable, script, "--worker",
                                                           "receiver" if host == 0 else "sender", str(host - 1),
                                                           str(collectors), str(port), json.dumps(plan)], env=env)
                     for host in range(collectors + 1)]
        codes = [process.wait(1800) for process in processes]
        leftovers = [hosts.shm_listing(host) for host in range(collectors + 1)]
    if any(codes):
        raise RuntimeError(f"workers exited with {codes}")
    result = json.loads(Path(plan["result"]).read_text())
    result["shm_leftovers"] = leftovers
    return result


def summarize(collectors: int, result: Dict[str, Any], methods: List[str], sizes: List[int]) -> List[str]:
    lines = []
    for size in sizes:
        runs: Dict[str, List[float]] = {method: [] for method in methods}
        for case in result["cases"]:
            if case["size"] == size:
                runs[case["method"]].append(case["gb_per_s"])
        cells = " ".join(f"{method} {'/'.join(f'{v:.2f}' for v in runs[method]):>17}" for method in methods)
        ring, engine = statistics.median(runs["ring"]), statistics.median(runs["engine"])
        sock, pickled = statistics.median(runs["socket"]), statistics.median(runs["pickle"])
        # socket/pickle: what any transport over this link could show against pickle (the
        # ring/pickle target is >= 3x); engine/pickle: what one over gloo could.
        lines.append(f"{collectors} x {size >> 10:>5} KiB  GB/s (3 runs) {cells}  | ring/engine {ring / engine:.2f}"
                     f"  ring/pickle {ring / pickled:.2f} (target >= 3; caps: socket/pickle {sock / pickled:.2f},"
                     f" engine/pickle {engine / pickled:.2f})  engine/socket {engine / sock:.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 1024, 4096])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mib", type=int, default=512,
                        help="MiB moved per case, all collectors together (default %(default)s; at 128 a 1 MiB "
                             "case lasted 40 ms, and the medians of 3 swung 0.6-1.5x on a noisy 2-vCPU VM)")
    parser.add_argument("--quick", action="store_true", help="1 collector, 16 MiB per case, 1 run")
    parser.add_argument("--json", type=str, default=None, help="write the raw results here")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        role, index, collectors, port, plan = args.worker
        worker(role, int(index), int(collectors), int(port), json.loads(plan))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
    from simulated_hosts import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    if args.quick:
        args.collectors, args.runs, args.mib = [1], 1, 16
    methods = [method for method in METHODS if method != "zmq" or zmq_available()]
    sizes = [kib << 10 for kib in args.sizes_kib]
    import torch

    from tensorxfer.benchmarks.report import cpu_header

    model_line = cpu_header()
    print(f"{model_line}, torch {torch.__version__}, "
          f"pyzmq {'yes' if 'zmq' in methods else 'not installed'}")
    plan = {"runs": args.runs, "sizes": sizes, "methods": methods, "mib": args.mib, "latency": True}
    import tempfile

    everything: Dict[str, Any] = {"cpu": model_line, "methods": methods}
    with tempfile.TemporaryDirectory() as tmp:
        for collectors in args.collectors:
            result = run_collectors(collectors, plan, Path(tmp))
            everything[str(collectors)] = result
            for line in summarize(collectors, result, methods, sizes):
                print(line, flush=True)
            if "latency" in result:
                latency = result["latency"]
                print(f"1 x 64 KiB latency p50: publish -> acquire_ready {latency['ring_p50_us']:.0f} us, raw socket "
                      f"round trip {latency['socket_rtt_p50_us']:.0f} us "
                      f"(ratio {latency['ring_p50_us'] / latency['socket_rtt_p50_us']:.2f}, target <= 2); "
                      f"the engine's floor: gloo one way {latency['gloo_one_way_p50_us']:.0f} us "
                      f"({latency['gloo_one_way_p50_us'] / latency['socket_rtt_p50_us']:.2f} socket round trips), "
                      f"gloo round trip {latency['gloo_rtt_p50_us']:.0f} us", flush=True)
            if any(result["shm_leftovers"]):
                print(f"  /dev/shm not clean: {result['shm_leftovers']}")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
