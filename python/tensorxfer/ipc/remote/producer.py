"""RemoteSlotRing: a producer of a learner's ring on another host (see :mod:`tensorxfer.ipc.remote`).

It offers a local producer's calls.  Its slots are private buffers of this
process (nothing in ``/dev/shm``), one per credit the learner grants; ``publish``
sends the slot's bytes and then its header, and gloo writes them once the learner
has a ring slot held for them (its receive is the credit).  The slot comes back to
``acquire_free`` once its bytes have left.  Three daemon threads: one waits for
sends to complete (gloo reports completion only through a wait without a deadline:
a wait that times out closes the pair), one for the learner's close, one sends a
heartbeat when nothing was sent for a quarter of the learner's timeout.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import os
import secrets
import socket
import threading
import time
import weakref
from typing import Any, Deque, Iterator, List, Optional, Tuple, Union

import numpy as np

from tensorxfer._arguments import UINT64_MAX, check_int
from tensorxfer.errors import ClosedError, PeerLostError, check_timeout
from tensorxfer.ipc.remote import handshake, protocol
from tensorxfer.ipc.remote.protocol import JoinRecord, RingInfo
from tensorxfer.ipc.remote.rendezvous import open_store

_FREE, _HELD, _SENDING = "free", "held", "sending"
# Open producers, closed at exit: a gloo group still alive when the interpreter finalises
# aborts the process ("terminate called without an active exception").
_OPEN: "weakref.WeakSet[RemoteSlotRing]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for producer in list(_OPEN):
        producer.close(timeout=1.0)
_SLICE_S = 0.05  # waits wake this often to notice Ctrl-C
# gloo waits with this deadline: a learner may back-pressure for long, and its death closes the pair.
_NO_DEADLINE = datetime.timedelta(days=7)
# A send that fails may have met the learner's close: the learner sends its close notice,
# then drops the link. The thread that hears the notice ends as soon as the link does, and
# the failed send waits this long at most for it, so that the loss reported is the close.
_CLOSE_NOTICE_GRACE_S = 1.0


def _check_index(value: Any, name: str, high: int) -> int:
    return check_int(value, name, 0, high - 1)


class RemoteSlotRing:
    """A producer of a learner's ring over torch.distributed point-to-point (gloo). Build it with :meth:`connect`."""

    def __init__(self, store: Any, group: Any, info: RingInfo, record: JoinRecord, address: str) -> None:
        import torch

        self._store = store
        self._group = group
        self._info = info
        self.record = record
        self.init_method = address
        self._buffers = [np.empty(info.slot_nbytes, dtype=np.uint8) for _ in range(info.credits)]
        self._tensors = [torch.from_numpy(buffer) for buffer in self._buffers]
        # One header per slot, written in place by publish (no allocation per slot).
        self._header_tensors = [torch.zeros(protocol.HEADER_WORDS, dtype=torch.int64) for _ in range(info.credits)]
        self._header_words = [header.numpy() for header in self._header_tensors]
        self._states: List[str] = [_FREE] * info.credits
        self._sequence = 0
        self._lost: Optional[str] = None
        self._closed = False
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()  # publish, heartbeats and bye send on one pair, in order
        # Sends not known complete yet, oldest first: (slot or None for a bare header, its works).
        self._in_flight: Deque[Tuple[Optional[int], Tuple[Any, ...]]] = collections.deque()
        self._last_send = time.monotonic()
        self._stop = threading.Event()
        self._close_heard = threading.Event()  # _hear_close has ended: the close notice came, or the link broke
        self._threads = [threading.Thread(target=target, daemon=True, name=f"tensorxfer-remote-{what}")
                         for what, target in (("sends", self._complete_sends), ("close", self._hear_close),
                                              ("heartbeat", self._heartbeat))]
        for thread in self._threads:
            thread.start()
        _OPEN.add(self)

    @classmethod
    def connect(cls, init_method: Optional[str] = None, *, name: Optional[str] = None, timeout: float = 30.0,
                key: str = "ring", token: Union[str, bytes, None] = None) -> "RemoteSlotRing":
        """Joins the learner's ring served at ``init_method`` as a producer.

        A producer that died may connect again: it is a new session.

        Args:
            init_method: ``"tcp://HOST:PORT"``, or ``"env://"`` / ``None`` for
                ``MASTER_ADDR`` and ``MASTER_PORT``.
            name: labels this producer in the learner's errors (default ``host:pid``; at
                most 256 characters).
            timeout: seconds to wait for the learner.
            key: which of the learner's served rings to join: the ``key`` given to
                ``RemoteProducers.serve`` (default ``"ring"``).
            token: the learner's shared secret (default: ``$TENSORXFER_REMOTE_TOKEN`` if
                set); with one, the learner must prove it holds it too.

        Raises:
            TimeoutError: no learner answered within ``timeout`` (or ``RuntimeError``,
                as torch's store reports it).
            tensorxfer.PeerLostError: the learner has closed.
            PermissionError: the learner refuses this producer (another protocol version,
                a missing or wrong token) or cannot prove it holds the token.
        """
        import torch.distributed as dist

        timeout = protocol.check_seconds(timeout, "timeout")
        secret = handshake.resolve_token(token)
        host = socket.gethostname()[:256]
        name = f"{host}:{os.getpid()}" if name is None else name
        if not isinstance(name, str) or not name or len(name) > 256:
            raise ValueError(f"name must be a non-empty str of at most 256 characters, got {name!r}")
        prefix = protocol.store_prefix(key)
        deadline = time.monotonic() + timeout
        store, address = open_store(init_method, serve=False, timeout=timeout)
        info = RingInfo.decode(store.get(prefix + "info"))
        if store.check([prefix + "closed"]):
            raise PeerLostError(f"the learner at {address} has closed its ring {info.ring!r}")
        session = int(store.add(prefix + "joins", 1))
        record = JoinRecord(session, name, host, os.getpid(), nonce=secrets.token_hex(16))
        handshake.join(store, prefix, record, info.ring, secret, address, deadline)
        group = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}session/{session}/", store), 1, 2,
                                      datetime.timedelta(seconds=timeout))
        return cls(store, group, info, record, address)

    # ---- properties -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Slots this producer may have in flight, which are the learner's credits."""
        return self._info.credits

    @property
    def slot_nbytes(self) -> int:
        """Bytes per slot (the learner ring's)."""
        return self._info.slot_nbytes

    @property
    def name(self) -> str:
        """This producer's name in the learner's errors."""
        return self.record.name

    # ---- the producer calls -----------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("remote ring is closed")
        if self._lost is not None:
            raise PeerLostError(self._lost)

    def acquire_free(self, timeout: Optional[float] = None) -> int:
        """Returns a slot to write, once one of this producer's slots has left.

        A slot leaves once the learner holds a ring slot for it: the learner's
        back-pressure.

        Args:
            timeout: seconds, or ``None`` for no deadline.

        Raises:
            TimeoutError: ``timeout`` passed.
            tensorxfer.PeerLostError: the learner closed or the link broke.
        """
        checked = check_timeout(timeout, "RemoteSlotRing.acquire_free")
        deadline = None if checked is None else time.monotonic() + checked
        with self._cond:
            while True:
                self._check_usable()
                for slot, state in enumerate(self._states):
                    if state == _FREE:
                        self._states[slot] = _HELD
                        return slot
                remaining = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
                if remaining <= 0:
                    raise TimeoutError(f"RemoteSlotRing.acquire_free: no credit from the learner at "
                                       f"{self.init_method} within {checked:g} s ({self.depth} slots in flight)")
                self._cond.wait(remaining)

    def slot_array(self, slot: int) -> np.ndarray:
        """The slot's bytes as a writable ``numpy.uint8`` array (``slot_nbytes`` long)."""
        return self._buffers[_check_index(slot, "slot", self.depth)]

    def slot_tensor(self, slot: int) -> Any:
        """The slot as a ``torch.uint8`` tensor (shares memory with :meth:`slot_array`)."""
        return self._tensors[_check_index(slot, "slot", self.depth)]

    def publish(self, slot: int, tick_id: int, nbytes: Optional[int] = None) -> None:
        """Sends the slot to the learner, labelled ``tick_id``.

        It reaches the learner's ``acquire_ready`` whole, after this producer's earlier
        slots.

        Args:
            slot: a slot from :meth:`acquire_free`.
            tick_id: the label, 0..2**64-1.
            nbytes: send only the first ``nbytes`` (1..slot_nbytes; default all).

        Raises:
            ValueError: a slot not held, a tick id or ``nbytes`` out of range (nothing is
                sent, the slot stays held).
            tensorxfer.PeerLostError: the learner is gone.
        """
        slot = _check_index(slot, "slot", self.depth)
        tick_id = check_int(tick_id, "tick_id", 0, UINT64_MAX)
        count = self.slot_nbytes if nbytes is None else check_int(
            nbytes, f"nbytes (a slot holds {self.slot_nbytes} bytes)", 1, self.slot_nbytes)
        with self._cond:
            self._check_usable()
            if self._states[slot] != _HELD:
                raise ValueError(f"RemoteSlotRing.publish: slot {slot} is not held for writing "
                                 f"({self._states[slot]}); publish only slots from acquire_free, once")
            words = self._header_words[slot]
            words[0], words[1], words[2], words[3] = (protocol.KIND_DATA, self._sequence,
                                                      protocol.tick_to_wire(tick_id), count)
            try:
                with self._send_lock:
                    # Bytes first, then the header: the learner wakes once, on the header, with the
                    # bytes already in its ring slot (one TCP stream keeps the order).
                    whole = self._tensors[slot]
                    data = self._group.send([whole if count == whole.numel() else whole[:count]], 0,
                                            protocol.TAG_DATA)
                    header = self._group.send([self._header_tensors[slot]], 0, protocol.TAG_HEADER)
                    self._last_send = time.monotonic()
            except Exception as error:  # noqa: BLE001 - the pair is broken
                self._mark_lost_locked(f"the link to the learner at {self.init_method} broke: "
                                       f"{str(error).splitlines()[0]}")
                raise PeerLostError(self._lost) from None
            self._states[slot] = _SENDING
            self._sequence += 1
            self._in_flight.append((slot, (data, header)))
            self._cond.notify_all()

    def abandon(self, slot: int) -> None:
        """Hand a slot from :meth:`acquire_free` back unpublished."""
        slot = _check_index(slot, "slot", self.depth)
        with self._cond:
            if self._states[slot] != _HELD:
                raise ValueError(f"RemoteSlotRing.abandon: slot {slot} is not held for writing ({self._states[slot]})")
            self._states[slot] = _FREE
            self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self, tick_id: int, timeout: Optional[float] = None) -> Iterator[int]:
        """As :meth:`tensorxfer.ipc.SlotRing.writing`: publish on success, abandon on an exception."""
        slot = self.acquire_free(timeout)
        try:
            yield slot
        except BaseException:
            if not self._closed and self._lost is None:
                self.abandon(slot)
            raise
        self.publish(slot, tick_id)

    # ---- threads ----------------------------------------------------------------------

    def _mark_lost_locked(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        self._cond.notify_all()

    def _mark_lost(self, reason: str) -> None:
        with self._cond:
            self._mark_lost_locked(reason)

    def _complete_sends(self) -> None:
        """Waits for each send in order and frees its slot; a failed send is the link's loss.

        There is no deadline: the learner's back-pressure may last.
        """
        while True:
            with self._cond:
                while not self._in_flight and not self._stop.is_set():
                    self._cond.wait()
                if not self._in_flight:
                    return
                slot, works = self._in_flight[0]
            try:
                for work in works:
                    work.wait(_NO_DEADLINE)
            except Exception as error:  # noqa: BLE001 - the pair closed
                if not self._stop.is_set():
                    self._close_heard.wait(_CLOSE_NOTICE_GRACE_S)  # a close notice, if one came, names the loss
                    self._mark_lost(f"the link to the learner at {self.init_method} broke while sending: "
                                    f"{str(error).splitlines()[0]}")
                return
            with self._cond:
                self._in_flight.popleft()
                if slot is not None:
                    self._states[slot] = _FREE
                self._cond.notify_all()

    def _hear_close(self) -> None:
        """Waits for the learner's one control message, its close; the pair failing ends it too."""
        import torch

        word = torch.zeros(1, dtype=torch.int64)
        try:
            self._group.recv([word], 0, protocol.TAG_CONTROL).wait(_NO_DEADLINE)
        except Exception as error:  # noqa: BLE001 - the pair closed
            if not self._stop.is_set():
                self._mark_lost(f"the link to the learner at {self.init_method} broke: {str(error).splitlines()[0]}")
            self._close_heard.set()
            return
        self._mark_lost(f"the learner at {self.init_method} closed its ring {self._info.ring!r}")
        self._close_heard.set()
        self._send_header(protocol.KIND_BYE)

    def _send_header(self, kind: int) -> None:
        import torch

        header = torch.tensor([kind, 0, 0, 0], dtype=torch.int64)
        with self._cond:
            try:
                with self._send_lock:
                    work = self._group.send([header], 0, protocol.TAG_HEADER)
                    self._last_send = time.monotonic()
            except Exception:  # noqa: BLE001 - the pair is broken: the other threads report it
                return
            self._in_flight.append((None, (work,)))
            self._cond.notify_all()

    def _heartbeat(self) -> None:
        interval = self._info.timeout / 4
        while not self._stop.wait(interval / 2):
            if self._lost is None and time.monotonic() - self._last_send >= interval:
                self._send_header(protocol.KIND_HEARTBEAT)

    # ---- lifetime ---------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout``) for the slots sent to leave, say bye, and drop the link.  Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
        for last in (False, True):
            with self._cond:
                while self._in_flight and self._lost is None and time.monotonic() < deadline:
                    self._cond.wait(min(_SLICE_S, max(0.0, deadline - time.monotonic())))
                if last or self._lost is not None:
                    break
            self._send_header(protocol.KIND_BYE)  # then wait for it to leave as well
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        _OPEN.discard(self)
        group, self._group = self._group, None
        group.abort()  # the waits still pending fail now, and their threads end
        for thread in self._threads:
            thread.join(5.0)
        self._in_flight.clear()
        self._store = None

    def __enter__(self) -> "RemoteSlotRing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("lost" if self._lost else "open")
        return f"RemoteSlotRing(name={self.name!r}, learner={self.init_method!r}, depth={self.depth}, {state})"
