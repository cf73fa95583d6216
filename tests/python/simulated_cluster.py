"""A simulated cluster: hosts as Linux namespaces joined by rate-limited veth "NICs" on one bridge.

Each host is a process (its *holder*) in its own network, IPC and mount namespaces with
its own tmpfs ``/dev/shm``; its NIC is one end of a veth pair (``eth0``, address
``10.77.0.<host + 1>/24``) whose other end is a port of a bridge that lives in a
namespace of its own (the *switch*). The switch has no address and no uplink: no default
route, no NAT, nothing outside the cluster's subnet, so the traffic never leaves this
machine. ``nic_rate`` limits each NIC both ways with ``tc tbf`` (the host's egress on
``eth0``, its ingress on the switch's port), so bytes between hosts are bound by the link,
as on a real cluster, and not by the two cores that push them through the kernel.

Ranks run in a host with :meth:`SimulatedCluster.prefix` (``nsenter`` into the holder's
namespaces) and :meth:`SimulatedCluster.environment` (``GLOO_SOCKET_IFNAME=eth0``).
:meth:`cut_link` takes a host's port off the bridge (a cable pulled: packets vanish, no
reset reaches anyone), :meth:`kill_host` SIGKILLs every process of a host.

Teardown: every holder is started with ``setpriv --pdeathsig KILL``, so the namespaces
(and with them the veths, the bridge and each host's ``/dev/shm``) vanish when the
holders die: at :meth:`close`, or when the process that made the cluster dies. Make the
cluster on the main thread (a holder's parent-death signal follows the thread that forked it).

Needs root, iproute2 (``ip``, ``tc``), util-linux (``unshare``, ``nsenter``, ``setpriv``)
and the kernel's tbf scheduler. Per-host latency would need netem, which this machine's
kernel lacks (``CONFIG_NET_SCH_NETEM`` is not set): :func:`latency_unavailable_reason` says so.

A test fixture (used by the cluster tests and ``bench/python/bench_refit_hosts.py``, which
put ``tests/python`` on ``sys.path``): it is not part of the installed package.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import warm_launcher

SUBNET = "10.77.0"
#: Bytes a tbf bucket holds: about 8 ms at 1 Gbit/s; larger bursts let short transfers run
#: above the rate, smaller ones cost throughput at these rates.
_BURST = "1mb"
_HOLD = "exec sleep 86400"


def unavailable_reason() -> Optional[str]:
    """Why a cluster cannot be simulated here, or None."""
    if os.geteuid() != 0:
        return "a simulated cluster needs root (network namespaces, veth pairs, tc)"
    for tool in ("ip", "tc", "unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"a simulated cluster needs {tool}, which is not installed"
    probe = subprocess.run(["unshare", "--net", "sh", "-c",
                            "ip link add name a type veth peer name b && "
                            f"tc qdisc add dev a root tbf rate 1gbit burst {_BURST} latency 50ms"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"a simulated cluster needs veth pairs and tc tbf: {probe.stderr.strip()}"
    return None


def latency_unavailable_reason() -> Optional[str]:
    """Why per-host latency (netem) cannot be added here, or None."""
    try:
        with gzip.open("/proc/config.gz", "rt") as config:
            if "CONFIG_NET_SCH_NETEM=y" not in config.read() and not os.path.isdir("/sys/module/sch_netem"):
                return "this kernel has no netem (CONFIG_NET_SCH_NETEM is not set): no per-host latency"
    except OSError:
        pass
    probe = subprocess.run(["unshare", "--net", "sh", "-c",
                            "ip link add name a type veth peer name b && tc qdisc add dev a root netem delay 1ms"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"tc netem is not available: {probe.stderr.strip()}"


def _holder(namespaces: Sequence[str], setup: str) -> subprocess.Popen:
    """A process in new ``namespaces`` that runs ``setup``, prints ready and sleeps."""
    command = ["setpriv", "--pdeathsig", "KILL", "unshare", *namespaces, "sh", "-c",
               f"{setup} && echo ready && {_HOLD}"]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = holder.stdout.readline() if holder.stdout else ""
    if line.strip() != "ready":
        holder.kill()
        _, error = holder.communicate()
        raise RuntimeError(f"could not start a namespace holder ({' '.join(namespaces)}): {error.strip()}")
    return holder


class SimulatedCluster:
    """``SimulatedCluster(3, nic_rate="1gbit")``: three hosts whose NICs run at 1 Gbit/s
    each way (None: no limit but the kernel's). Use as a context manager."""

    def __init__(self, hosts: int, nic_rate: Optional[str] = "1gbit") -> None:
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts: expected 1..200, got {hosts}")
        self.hosts = hosts
        self.nic_rate = nic_rate
        self._switch: Optional[subprocess.Popen] = None
        self._holders: List[subprocess.Popen] = []
        self._started: Dict[int, List[subprocess.Popen]] = {}
        try:
            self._switch = _holder(["--net"], "ip link set lo up && ip link add name br0 type bridge && "
                                              "ip link set br0 up")
            for host in range(hosts):
                holder = _holder(["--net", "--ipc", "--mount", "--propagation", "private"],
                                 "mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm && ip link set lo up")
                self._holders.append(holder)
                self._wire(host, holder.pid)
        except BaseException:
            self.close()
            raise

    # ---- set-up ---------------------------------------------------------------------

    def _in_switch(self, *command: str) -> None:
        assert self._switch is not None
        _run(["nsenter", "-t", str(self._switch.pid), "--net", "--", *command])

    def _in_host(self, host: int, *command: str) -> None:
        _run(["nsenter", "-t", str(self._holders[host].pid), "--net", "--", *command])

    def _wire(self, host: int, host_pid: int) -> None:
        port = f"p{host}"
        self._in_switch("ip", "link", "add", "name", port, "type", "veth", "peer", "name", f"nic{host}")
        self._in_switch("ip", "link", "set", f"nic{host}", "netns", str(host_pid))
        self._in_switch("ip", "link", "set", port, "master", "br0")
        self._in_switch("ip", "link", "set", port, "up")
        self._in_host(host, "ip", "link", "set", f"nic{host}", "name", "eth0")
        self._in_host(host, "ip", "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        self._in_host(host, "ip", "link", "set", "eth0", "up")
        if self.nic_rate is not None:
            shape = ["root", "tbf", "rate", self.nic_rate, "burst", _BURST, "latency", "50ms"]
            self._in_host(host, "tc", "qdisc", "add", "dev", "eth0", *shape)  # the host's egress
            self._in_switch("tc", "qdisc", "add", "dev", port, *shape)        # its ingress

    # ---- use ------------------------------------------------------------------------

    def address(self, host: int) -> str:
        """The host's IPv4 address on the cluster's subnet."""
        return f"{SUBNET}.{host + 1}"

    def prefix(self, host: int) -> List[str]:
        """The command prefix that runs a program inside ``host``."""
        return ["nsenter", "-t", str(self._holders[host].pid), "--net", "--ipc", "--mount", "--"]

    def environment(self, host: int, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` (default: os.environ) with what a rank in ``host`` needs: gloo's interface."""
        env = dict(os.environ if base is None else base)
        env["GLOO_SOCKET_IFNAME"] = "eth0"
        env["TENSORXFER_SIMULATED_HOST"] = str(host)
        return env

    def popen(self, host: int, argv: Sequence[str], **options: object) -> subprocess.Popen:
        """Starts ``argv`` inside ``host`` (killed at close()); ``env`` defaults to environment(host).
        A Python script is forked from a warm interpreter (warm_launcher.py) that enters the host."""
        options.setdefault("env", self.environment(host))
        process = warm_launcher.popen(self.prefix(host) + list(argv), **options)  # type: ignore[arg-type]
        self._started.setdefault(host, []).append(process)
        return process

    def start_ranks(self, ranks_per_host: Sequence[int], argv: Sequence[str], port: int = 29500,
                    env: Optional[Dict[str, str]] = None, **options: object) -> List[subprocess.Popen]:
        """One process per rank, ranks numbered host by host, each started as ``argv`` with
        RANK, WORLD_SIZE, MASTER_ADDR (host 0's address) and MASTER_PORT set: a
        ``tcp://`` rendezvous of torch.distributed on the cluster's own subnet."""
        if len(ranks_per_host) > self.hosts:
            raise ValueError(f"{len(ranks_per_host)} hosts of ranks on a cluster of {self.hosts}")
        world = sum(ranks_per_host)
        processes = []
        rank = 0
        for host, count in enumerate(ranks_per_host):
            for _ in range(count):
                rank_env = self.environment(host, env)
                rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=self.address(0),
                                MASTER_PORT=str(port))
                processes.append(self.popen(host, argv, env=rank_env, **options))
                rank += 1
        return processes

    def cut_link(self, host: int) -> None:
        """Takes the host's port off the bridge: every packet to or from it vanishes (no
        reset, no FIN), as when a cable is pulled."""
        self._in_switch("ip", "link", "set", f"p{host}", "down")

    def restore_link(self, host: int) -> None:
        self._in_switch("ip", "link", "set", f"p{host}", "up")

    def pids(self, host: int) -> List[int]:
        """Every process in the host's network namespace but its holder."""
        holder = self._holders[host].pid
        try:
            target = os.stat(f"/proc/{holder}/ns/net").st_ino
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == holder:
                continue
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def kill_host(self, host: int) -> None:
        """SIGKILLs every process of the host (its namespaces and /dev/shm stay)."""
        for _ in range(20):
            victims = self.pids(host)
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for process in self._started.get(host, []):
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def shm_listing(self, host: int) -> List[str]:
        """What is in the host's /dev/shm now."""
        done = subprocess.run(self.prefix(host) + ["ls", "-A", "/dev/shm"], capture_output=True, text=True,
                              check=True)
        return done.stdout.split()

    def tcp_rate(self, src: int, dst: int, nbytes: int = 64 << 20) -> float:
        """Bytes per second of one raw TCP stream from ``src`` to ``dst`` (the NIC floor's rate)."""
        port = 29000 + (os.getpid() % 1000)
        server = self.popen(dst, [sys.executable, "-c", _TCP_SINK, self.address(dst), str(port), str(nbytes)],
                            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "listening":
                raise RuntimeError("the TCP sink did not start")
            client = self.popen(src, [sys.executable, "-c", _TCP_SOURCE, self.address(dst), str(port), str(nbytes)],
                                stdout=subprocess.PIPE, text=True)
            out, _ = client.communicate(timeout=600)
            seconds = float(server.stdout.readline())
            server.wait(timeout=10)
            if client.returncode != 0:
                raise RuntimeError(f"the TCP source failed: {out}")
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        return nbytes / seconds

    # ---- teardown -------------------------------------------------------------------

    def close(self) -> None:
        for host in range(len(self._holders)):
            self.kill_host(host)
        for holder in self._holders + ([self._switch] if self._switch is not None else []):
            holder.kill()
            holder.wait()
            for stream in (holder.stdout, holder.stderr):
                if stream is not None:
                    stream.close()
        for processes in self._started.values():
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
                for stream in (process.stdin, process.stdout, process.stderr):
                    if stream is not None:
                        stream.close()
        self._holders = []
        self._switch = None
        self._started = {}

    def __enter__(self) -> "SimulatedCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run(command: List[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")


# The raw TCP floor: a sink that times the bytes from the first one received to the last.
_TCP_SINK = """
import socket, sys, time
address, port, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
server = socket.socket(); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((address, port)); server.listen(1); print("listening", flush=True)
connection, _ = server.accept()
buffer = bytearray(4 << 20); view = memoryview(buffer); got = connection.recv_into(view); start = time.perf_counter()
while got < nbytes:
    count = connection.recv_into(view)
    if not count: break
    got += count
print(time.perf_counter() - start, flush=True)
connection.sendall(b"x")
"""
_TCP_SOURCE = """
import socket, sys
address, port, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
connection = socket.create_connection((address, port)); chunk = bytes(4 << 20); sent = 0
while sent < nbytes:
    count = min(len(chunk), nbytes - sent); connection.sendall(chunk[:count]); sent += count
connection.recv(1)
"""
