"""RemoteProducers: the learner's side of remote producers (see :mod:`tensorxfer.ipc.remote`).

One relay thread per producer session.  It attaches to the learner's ring as a
local producer and holds ``credits`` free ring slots for its remote producer,
with a receive posted straight into each: gloo lets the producer's bytes leave
only into a posted receive, so these receives are the producer's credits.  When a
slot's header arrives (after its bytes, on the same stream) the relay publishes
that slot, so ``acquire_ready`` never sees a slot before all its bytes are there,
and holds the next free slot.  A session that fails (its socket closed, nothing
heard within ``timeout``, a header that breaks the protocol) is reported through
:meth:`SlotRing.report_peer_lost` and its unfilled slots go back to the ring.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Tuple

from tensorxfer import _core
from tensorxfer._arguments import check_int
from tensorxfer._tensor import native_view
from tensorxfer.ipc.remote import protocol
from tensorxfer.ipc.remote.protocol import JoinRecord, RingInfo
from tensorxfer.ipc.remote.rendezvous import open_store, parse_init_method
from tensorxfer.ipc.slot_ring import SlotRing

_POLL_S = 0.02
# Servers still open, closed at exit (a gloo group alive at finalisation aborts the process).
_OPEN: "weakref.WeakSet[RemoteProducers]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for server in list(_OPEN):
        server.close()


class _SessionEnded(Exception):
    """A session's relay stops without a loss to report (the producer said bye, or the learner closes)."""


class _ProtocolError(Exception):
    """The producer sent something the protocol does not allow."""


@dataclass
class ProducerStats:
    """What one session delivered (``RemoteProducers.stats``)."""

    name: str
    session: int
    slots: int = 0
    bytes: int = 0
    state: str = "joining"  # joining | active | closed | lost
    reason: str = ""
    started: float = field(default_factory=time.monotonic)


class _Session:
    """One producer's relay: its gloo pair, its proxy producer on the ring, the slots it holds."""

    def __init__(self, owner: "RemoteProducers", record: JoinRecord) -> None:
        self.owner = owner
        self.record = record
        self.stats = ProducerStats(record.name, record.session)
        self.group: Any = None
        self.close_lock = threading.Lock()
        self.close_work: Any = None  # the CLOSE message's send (it holds its tensor)
        self.thread = threading.Thread(target=self.run, name=f"tensorxfer-relay-{record.session}", daemon=True)

    # ---- the relay ----------------------------------------------------------------

    def run(self) -> None:
        import torch
        import torch.distributed as dist

        owner = self.owner
        proxy: Optional[SlotRing] = None
        try:
            # A store client of its own: the group's rendezvous blocks in store waits, which would
            # hold up the other sessions' rendezvous on a shared client.
            client = owner._client_store()
            store = dist.PrefixStore(f"{owner._prefix}session/{self.record.session}/", client)
            self.group = dist.ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=owner.timeout))
            del store, client
            proxy = SlotRing.attach(owner._ring.handle)
            arrays = [proxy.slot_array(slot) for slot in range(proxy.depth)]
            # gloo writes the producer's bytes through this new mapping: its page tables are made
            # now, not by a fault on every page of the first pass (contents unchanged: other
            # producers may be writing their slots).
            for array in arrays:
                _core.populate_host_pages(native_view(array, "slot"), "slot")
            views = [torch.from_numpy(array) for array in arrays]
            reserved: Deque[Tuple[int, Any]] = collections.deque()
            self.stats.state = "active"
            self.hold(proxy, views, reserved, owner.credits)
            # A header receive posted for every slot the producer may send and two more (heartbeat,
            # bye): a header never waits for a receive, which would cost gloo a round trip.
            headers: Deque[Tuple[Any, Any]] = collections.deque()
            for _ in range(owner.credits + 2):
                buffer = torch.zeros(protocol.HEADER_WORDS, dtype=torch.int64)
                headers.append((buffer, self.group.recv([buffer], 1, protocol.TAG_HEADER)))
            expected_sequence = 0
            wait = datetime.timedelta(seconds=owner.timeout)
            data_wait = wait / 2
            while True:
                buffer, pending = headers.popleft()
                pending.wait(wait)
                kind, sequence, tick_word, nbytes = buffer.tolist()
                if kind == protocol.KIND_HEARTBEAT:
                    headers.append((buffer, self.group.recv([buffer], 1, protocol.TAG_HEADER)))
                    continue
                if kind == protocol.KIND_BYE:
                    raise _SessionEnded("closed")
                if kind != protocol.KIND_DATA:
                    raise _ProtocolError(f"sent a header of unknown kind {kind}")
                if sequence != expected_sequence:
                    raise _ProtocolError(f"sent slot sequence {sequence}, expected {expected_sequence} "
                                         "(its slots must arrive in publish order)")
                if not 1 <= nbytes <= owner.slot_nbytes:
                    raise _ProtocolError(f"announced {nbytes} bytes for a slot of {owner.slot_nbytes} bytes")
                if not reserved:
                    raise _ProtocolError("sent a slot without a credit")
                slot, received = reserved.popleft()
                # Every byte is in the slot after this wait.  They normally came before the header; they
                # come after it only when they waited for this receive.  gloo does not fail a receive
                # whose bytes are arriving when the link breaks (only those not started), so this wait
                # is the loss's backstop: half the timeout, so the loss is still reported within it.
                try:
                    received.wait(data_wait)
                except Exception as error:  # noqa: BLE001 - reported as what it means for this producer
                    raise RuntimeError(f"the bytes of its slot {sequence} stopped arriving for "
                                       f"{data_wait.total_seconds():g} s (its host died or its link broke: "
                                       f"{str(error).splitlines()[0]})") from None
                proxy.publish(slot, protocol.tick_from_wire(tick_word))
                # The hand-off is done: the bookkeeping comes after it.
                expected_sequence += 1
                self.stats.slots += 1
                self.stats.bytes += nbytes
                headers.append((buffer, self.group.recv([buffer], 1, protocol.TAG_HEADER)))
                self.hold(proxy, views, reserved, 1)
        except _SessionEnded as ended:
            self.stats.state, self.stats.reason = "closed", str(ended)
        except BaseException as error:  # noqa: BLE001 - every failure of a session is that producer's loss
            self.lost(error)
        finally:
            self.finish(proxy)

    def hold(self, proxy: SlotRing, views: List[Any], reserved: Deque[Tuple[int, Any]], count: int) -> None:
        """Holds ``count`` more free ring slots for the producer and posts a receive into each.

        Each slot so held is a credit. Waiting for the learner to free slots is the
        back-pressure.
        """
        for _ in range(count):
            while True:
                if self.owner._stopping.is_set():  # no more credits: the producer answers CLOSE with bye
                    self.request_close()
                    return
                try:
                    slot = proxy.acquire_free(timeout=_POLL_S)
                    break
                except TimeoutError:
                    continue
            reserved.append((slot, self.group.recv([views[slot]], 1, protocol.TAG_DATA)))

    def lost(self, error: BaseException) -> None:
        if isinstance(error, _ProtocolError):
            reason = f"broke the protocol: it {error}"
        elif isinstance(error, (KeyboardInterrupt, SystemExit)):
            reason = f"relay interrupted ({type(error).__name__})"
        else:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.stats.state, self.stats.reason = "lost", reason
        if self.owner._stopping.is_set():
            return  # the learner is closing: nothing to report to
        message = (f"{self.record.describe()} lost: {reason}; {self.stats.slots} of its slots were "
                   f"delivered whole, none of its unfinished ones")
        try:
            self.owner._ring.report_peer_lost(message)
        except Exception:  # noqa: BLE001 - the learner closed its ring: it no longer reads losses
            pass

    def finish(self, proxy: Optional[SlotRing]) -> None:
        # The gloo pair goes first, so no receive can land in a slot after it is handed back.
        group, self.group = self.group, None
        if group is not None:
            try:
                group.abort()
            except Exception:  # noqa: BLE001 - best effort; dropping it closes the sockets anyway
                pass
        self.close_work = None
        del group
        if proxy is not None:
            proxy.close()  # the slots still held for writing go back to the ring, unpublished

    def request_close(self) -> None:
        """Tells the producer that the learner closes; its calls then raise PeerLostError.

        The producer answers bye, and the relay still takes what it sent before, so the
        link closes with nothing unread.
        """
        import torch

        if self.group is None:
            return  # still joining: the relay sends it once the group is up (hold)
        with self.close_lock:
            if self.close_work is not None:
                return
            try:
                self.close_work = self.group.send([torch.tensor([protocol.CONTROL_CLOSE], dtype=torch.int64)], 1,
                                                  protocol.TAG_CONTROL)
            except Exception:  # noqa: BLE001 - a producer already gone needs no notice
                self.close_work = False


class RemoteProducers:
    """Feeds a learner's :class:`~tensorxfer.ipc.SlotRing` from producers on other hosts. Build it with :meth:`serve`."""

    def __init__(self, ring: SlotRing, store: Any, address: str, prefix: str, credits: int, timeout: float) -> None:
        self._ring = ring
        self._store = store
        self._prefix = prefix
        #: The address producers connect to (``tcp://HOST:PORT``), with the port the store got.
        self.init_method = address
        #: Slots each producer may have in flight.
        self.credits = credits
        #: Seconds of silence after which a producer is reported lost.
        self.timeout = timeout
        self.slot_nbytes = ring.slot_nbytes
        self._stopping = threading.Event()
        self._sessions: Dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._accepted = 0
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="tensorxfer-relay-accept", daemon=True)

    @classmethod
    def serve(cls, ring: SlotRing, init_method: Optional[str] = None, *, credits: int = 2, timeout: float = 30.0,
              key: str = "ring") -> "RemoteProducers":
        """Accepts remote producers into ``ring`` until :meth:`close`.

        Args:
            ring: a :class:`~tensorxfer.ipc.SlotRing` this process created (its consumer).
            init_method: ``"tcp://HOST:PORT"`` (port 0: any free one; :attr:`init_method`
                then names the port), or ``"env://"`` / ``None`` for ``MASTER_ADDR`` and
                ``MASTER_PORT``, as torchrun sets them.
            credits: ring slots each producer may have in flight (1..depth).
            timeout: seconds of silence after which a producer is reported lost (producers
                send heartbeats 4 times as often).
            key: names this ring among several served on one store (default ``"ring"``);
                producers pass the same to ``RemoteSlotRing.connect``.

        Returns:
            The running relay; close it (or use it as a context manager) before the ring.

        Raises:
            ValueError: ``ring`` is not this process's own ring, or ``credits`` is out of
                range.
        """
        if not isinstance(ring, SlotRing) or not ring.is_consumer:
            raise ValueError("ring must be a SlotRing this process created (its consumer)")
        credits = check_int(credits, "credits (at most the ring's depth)", 1, ring.depth)
        timeout = protocol.check_seconds(timeout, "timeout")
        prefix = protocol.store_prefix(key)
        store, address = open_store(init_method, serve=True, timeout=timeout)
        store.set(prefix + "info", RingInfo(ring.name, ring.slot_nbytes, credits, timeout).encode())
        server = cls(ring, store, address, prefix, credits, timeout)
        server._acceptor.start()
        _OPEN.add(server)
        return server

    def _client_store(self) -> Any:
        import torch.distributed as dist

        host, port = parse_init_method(self.init_method)
        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=self.timeout))

    # ---- producers --------------------------------------------------------------------

    def _accept(self) -> None:
        joins_key = self._prefix + "joins"
        while not self._stopping.wait(_POLL_S):
            try:
                joined = int(self._store.add(joins_key, 0))
            except Exception:  # noqa: BLE001 - the store is going away (close)
                return
            while self._accepted < joined and not self._stopping.is_set():
                session = self._accepted = self._accepted + 1
                try:  # a producer writes its record right after counting itself in
                    record = JoinRecord.decode(session, self._store.get(f"{self._prefix}join/{session}"))
                except Exception:  # noqa: BLE001 - it died in between, or wrote garbage: skip that session
                    continue
                relay = _Session(self, record)
                with self._lock:
                    self._sessions[session] = relay
                relay.thread.start()

    @property
    def stats(self) -> List[ProducerStats]:
        """One record per session so far (a restarted producer is a new session), by session number."""
        with self._lock:
            return [self._sessions[number].stats for number in sorted(self._sessions)]

    def active(self) -> List[str]:
        """Names of the producers connected now."""
        return [stats.name for stats in self.stats if stats.state == "active"]

    def wait_for_producers(self, count: int, timeout: float) -> None:
        """Blocks until ``count`` producers are connected at once; TimeoutError naming who is."""
        deadline = time.monotonic() + timeout
        while len(self.active()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} remote producers did not connect within {timeout:g} s "
                                   f"(connected: {self.active()}, sessions: {self.stats})")
            time.sleep(_POLL_S)

    # ---- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Stops serving: every producer is told that the learner closes.

        The producers' calls then raise ``PeerLostError``; the slots held for them go back
        to the ring (slots already published stay in it) and the rendezvous store stops.
        Idempotent; waits at most ``timeout`` seconds.
        """
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        self._stopping.set()
        try:
            self._store.set(self._prefix + "closed", b"1")
        except Exception:  # noqa: BLE001 - the store is torchrun's and it is gone: producers see their pair close
            pass
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.request_close()
        deadline = time.monotonic() + self.timeout
        for session in sessions:
            session.thread.join(max(0.0, deadline - time.monotonic()))
            if session.thread.is_alive() and session.group is not None:
                session.group.abort()  # its wait fails now; the thread hands the slots back
                session.thread.join(5.0)
        self._acceptor.join(5.0)
        self._store = None

    def __enter__(self) -> "RemoteProducers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteProducers(init_method={self.init_method!r}, active={self.active()}, closed={self._closed})"
