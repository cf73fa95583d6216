"""RemoteProducers: the learner's side of remote producers (see :mod:`tensorxfer.ipc.remote`).

Each producer session is first admitted (:mod:`tensorxfer.ipc.remote.handshake`) on a
thread of its own, so a connection that joins and then stalls delays nobody else.  An
admitted session gets a relay (:mod:`tensorxfer.ipc.remote.relay`): a process forked by
the learner's relay host (:mod:`tensorxfer.ipc.remote.relay_host`) that attaches to the
ring as a local producer, holds ``credits`` slots for its producer with a gloo receive
posted into each, and publishes a slot once all its bytes are there.  A relay in a
process of its own means a producer that makes gloo abort (a message longer than the
receive posted for it) ends its own session, not the learner.  The cost: the relay host is
one more Python process with torch imported (about 280 MiB resident with torch 2.13 on
CPU, measured by the soak), started by :meth:`RemoteProducers.serve`; each relay it forks
shares those pages copy-on-write.

A session that fails (its socket closed, nothing heard within ``timeout``, a header that
breaks the protocol, its relay process dying) is reported through
:meth:`SlotRing.report_peer_lost`, and its unfilled slots go back to the ring.  Every
refusal and every loss is logged (logger ``tensorxfer.ipc.remote``, level WARNING).
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Tuple, Union

from tensorxfer._arguments import check_int
from tensorxfer.ipc.remote import handshake, protocol
from tensorxfer.ipc.remote.protocol import JoinRecord, RingInfo
from tensorxfer.ipc.remote.relay_host import RelayHost
from tensorxfer.ipc.remote.rendezvous import open_store, parse_init_method
from tensorxfer.ipc.slot_ring import SlotRing

_POLL_S = 0.02
# Sessions admitted at once (each on its own thread); a join beyond this is refused at once.
MAX_JOINING = 16
# Refused sessions kept for RemoteProducers.refusals (the count of all is refused_count).
_REFUSALS_KEPT = 64
_log = logging.getLogger("tensorxfer.ipc.remote")
# Servers still open, closed at exit (a gloo group alive at finalisation aborts the process).
_OPEN: "weakref.WeakSet[RemoteProducers]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for server in list(_OPEN):
        server.close()


@dataclass
class ProducerStats:
    """What one session delivered (``RemoteProducers.stats``)."""

    name: str
    session: int
    slots: int = 0
    bytes: int = 0
    state: str = "joining"  # joining | active | closed | lost (refused sessions: refused)
    reason: str = ""
    started: float = field(default_factory=time.monotonic)


class _Session:
    """One admitted producer: its record, what its relay (a process of the relay host) reported."""

    def __init__(self, record: JoinRecord) -> None:
        self.record = record
        self.stats = ProducerStats(record.name, record.session)
        self.ended = threading.Event()  # its relay reported its end, or its process exited


class RemoteProducers:
    """Feeds a learner's :class:`~tensorxfer.ipc.SlotRing` from producers on other hosts. Build it with :meth:`serve`."""

    def __init__(self, ring: SlotRing, store: Any, address: str, prefix: str, credits: int, timeout: float,
                 token: Optional[bytes]) -> None:
        self._ring = ring
        self._store = store
        self._prefix = prefix
        self._token = token
        #: The address producers connect to (``tcp://HOST:PORT``), with the port the store got.
        self.init_method = address
        #: Slots each producer may have in flight.
        self.credits = credits
        #: Seconds of silence after which a producer is reported lost.
        self.timeout = timeout
        self.slot_nbytes = ring.slot_nbytes
        self._stopping = threading.Event()
        self._sessions: Dict[int, _Session] = {}
        self._joining: Dict[int, threading.Thread] = {}  # sessions being admitted
        self._refusals: Deque[ProducerStats] = collections.deque(maxlen=_REFUSALS_KEPT)
        self._stale_verdicts: Deque[Tuple[float, int]] = collections.deque()  # (when to delete, session)
        self.refused_count = 0
        self._lock = threading.Lock()
        self._accepted = 0
        self._closed = False
        self._host: Optional[RelayHost] = None
        self._acceptor = threading.Thread(target=self._accept, name="tensorxfer-relay-accept", daemon=True)

    @classmethod
    def serve(cls, ring: SlotRing, init_method: Optional[str] = None, *, credits: int = 2, timeout: float = 30.0,
              key: str = "ring", token: Union[str, bytes, None] = None) -> "RemoteProducers":
        """Accepts remote producers into ``ring`` until :meth:`close`.

        Args:
            ring: a :class:`~tensorxfer.ipc.SlotRing` this process created (its consumer).
            init_method: ``"tcp://HOST:PORT"`` (port 0: any free one; :attr:`init_method`
                then names the port), or ``"env://"`` / ``None`` for ``MASTER_ADDR`` and
                ``MASTER_PORT``, as torchrun sets them.
            credits: ring slots each producer may have in flight (1..depth).
            timeout: seconds of silence after which a producer is reported lost (producers
                send heartbeats 4 times as often), and the most each step of a producer's
                admission may take.
            key: names this ring among several served on one store (default ``"ring"``);
                producers pass the same to ``RemoteSlotRing.connect``.
            token: a shared secret of at least 16 bytes (default:
                ``$TENSORXFER_REMOTE_TOKEN`` if set): only producers that prove they hold it
                are admitted (an HMAC challenge-response, see
                ``tensorxfer/ipc/remote/handshake.py`` and ``SECURITY.md`` beside it: it does
                not encrypt).

        Returns:
            The running relay; close it (or use it as a context manager) before the ring.

        Raises:
            ValueError: ``ring`` is not this process's own ring, ``credits`` is out of
                range, or the token is shorter than 16 bytes.
        """
        if not isinstance(ring, SlotRing) or not ring.is_consumer:
            raise ValueError("ring must be a SlotRing this process created (its consumer)")
        credits = check_int(credits, "credits (at most the ring's depth)", 1, ring.depth)
        timeout = protocol.check_seconds(timeout, "timeout")
        prefix = protocol.store_prefix(key)
        secret = handshake.resolve_token(token)
        store, address = open_store(init_method, serve=True, timeout=timeout)
        store.set(prefix + "info", RingInfo(ring.name, ring.slot_nbytes, credits, timeout).encode())
        server = cls(ring, store, address, prefix, credits, timeout, secret)
        server._relay_host()  # it imports torch meanwhile: the first relay starts at once
        server._acceptor.start()
        _OPEN.add(server)
        return server

    def _relay_host(self) -> "RelayHost":
        """The relay host, started anew if the last one exited."""
        with self._lock:
            if self._host is None:
                self._host = RelayHost(self._on_event)
            return self._host

    # ---- producers --------------------------------------------------------------------

    def _accept(self) -> None:
        """Counts the joins and starts each session's thread; never waits on one producer."""
        joins_key = self._prefix + "joins"
        while not self._stopping.wait(_POLL_S):
            try:
                joined = int(self._store.add(joins_key, 0))
                self._forget_stale_verdicts()
            except Exception:  # noqa: BLE001 - the store is going away (close)
                return
            while self._accepted < joined and not self._stopping.is_set():
                session = self._accepted = self._accepted + 1
                with self._lock:
                    busy = len(self._joining) >= MAX_JOINING
                    if not busy:
                        thread = threading.Thread(target=self._admit_and_relay, args=(session,),
                                                  name=f"tensorxfer-relay-{session}", daemon=True)
                        self._joining[session] = thread
                if busy:
                    self._refuse(session, None, f"{MAX_JOINING} other sessions are joining at once",
                                 write_verdict=True)
                else:
                    thread.start()

    def _admit_and_relay(self, session: int) -> None:
        try:
            record, reason = handshake.admit(self._store, self._prefix, session, self._ring.name, self._token,
                                             self.timeout, self._stopping)
        except Exception as error:  # noqa: BLE001 - the store failed (the learner closes): nothing admitted
            record, reason = None, f"its admission failed: {str(error).splitlines()[0] if str(error) else error!r}"
        if reason or record is None or self._stopping.is_set():
            with self._lock:
                self._joining.pop(session, None)
            if not self._stopping.is_set():
                self._refuse(session, record, reason)
            return
        relayed = _Session(record)
        host, port = parse_init_method(self.init_method)
        spec = {"session": session, "ring": self._ring.name, "host": host, "port": port, "prefix": self._prefix,
                "credits": self.credits, "timeout": self.timeout, "slot_nbytes": self.slot_nbytes}
        with self._lock:
            self._joining.pop(session, None)
            self._sessions[session] = relayed
        if not self._relay_host().command(start=session, spec=spec):
            self._session_lost(relayed, "the learner's relay host is gone")

    # ---- what the relays report ----------------------------------------------------------

    def _on_event(self, event: Dict[str, Any]) -> None:
        """Runs on the relay host's reader thread, for every event of every relay."""
        kind = event.get("event")
        if kind == "host-exit":
            with self._lock:
                self._host = None
                unfinished = [relayed for relayed in self._sessions.values() if not relayed.ended.is_set()]
            for relayed in unfinished:
                self._session_lost(relayed, f"the learner's relay host exited (status {event.get('status')})")
            return
        with self._lock:
            found = self._sessions.get(int(event.get("session", -1)))
        if found is None or found.ended.is_set():
            return
        relayed = found
        stats = relayed.stats
        if kind == "active":
            stats.state = "active"
            # The producer read its verdict before it made its side of the pair.
            handshake.forget_verdict(self._store, self._prefix, relayed.record.session)
        elif kind in ("progress", "end"):
            stats.slots, stats.bytes = int(event.get("slots", 0)), int(event.get("bytes", 0))
            if kind == "end":
                if event.get("state") == "closed":
                    stats.state, stats.reason = "closed", str(event.get("reason", ""))
                    relayed.ended.set()
                else:
                    self._session_lost(relayed, str(event.get("reason", "")))
        elif kind == "exit":
            status = int(event.get("status", 0))
            how = f"signal {-status}" if status < 0 else f"exit status {status}"
            self._session_lost(relayed, f"its relay process died ({how}; gloo aborts a process on a message "
                                        "longer than the receive posted for it)")

    def _session_lost(self, relayed: _Session, reason: str) -> None:
        relayed.stats.state, relayed.stats.reason = "lost", reason
        relayed.ended.set()
        if self._stopping.is_set():
            return  # the learner is closing: nothing to report to
        message = (f"{relayed.record.describe()} lost: {reason}; {relayed.stats.slots} of its slots were "
                   f"delivered whole, none of its unfinished ones")
        _log.warning("remote ring %r: %s", self._ring.name, message)
        try:
            self._ring.report_peer_lost(message)
        except Exception:  # noqa: BLE001 - the learner closed its ring: it no longer reads losses
            pass

    def _refuse(self, session: int, record: Optional[JoinRecord], reason: str, write_verdict: bool = False) -> None:
        """Logs and counts a refused session.

        Its verdict (written by the admission, or here) is removed once the producer had
        time to read it.
        """
        who = record.describe() if record is not None else f"session {session}"
        _log.warning("remote ring %r: refused %s: %s", self._ring.name, who, reason)
        if write_verdict:
            handshake.refuse(self._store, self._prefix, session, reason)
        stats = ProducerStats(record.name if record is not None else "?", session, state="refused", reason=reason)
        with self._lock:
            self._refusals.append(stats)
            self.refused_count += 1
            self._stale_verdicts.append((time.monotonic() + self.timeout, session))

    def _forget_stale_verdicts(self) -> None:
        now = time.monotonic()
        while self._stale_verdicts and self._stale_verdicts[0][0] <= now:
            _, session = self._stale_verdicts.popleft()
            handshake.forget_verdict(self._store, self._prefix, session)

    @property
    def refusals(self) -> List[ProducerStats]:
        """The most recent refused sessions (up to 64; ``refused_count`` counts them all)."""
        with self._lock:
            return list(self._refusals)

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
            joining = list(self._joining.values())
            host = self._host
        deadline = time.monotonic() + self.timeout
        for thread in joining:  # admissions see _stopping within a poll and end
            thread.join(max(0.0, deadline - time.monotonic()))
        if host is not None:
            # Every relay tells its producer (which answers bye) and hands its slots back; the host
            # then exits. Relays not done by the deadline are killed: the ring reclaims their slots.
            host.command(close="all")
            for relayed in sessions:
                relayed.ended.wait(max(0.0, deadline - time.monotonic()))
            host.close(max(1.0, deadline - time.monotonic()))
        self._acceptor.join(5.0)
        self._store = None

    def __enter__(self) -> "RemoteProducers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteProducers(init_method={self.init_method!r}, active={self.active()}, closed={self._closed})"
