"""RemoteSlotRing: a producer of a learner's ring on another host (see :mod:`tensorxfer.ipc.remote`).

It offers a local producer's calls.  Its slots are private buffers of this
process (nothing in ``/dev/shm``), one per credit the learner grants; ``publish``
sends the slot to the ring slot the learner holds for it, and the slot comes back
to ``acquire_free`` once the learner has taken its bytes and granted a new credit.
Two daemon threads: one receives credits (and the learner's close), one sends a
heartbeat when nothing was sent for a quarter of the learner's timeout.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import os
import socket
import threading
import time
import weakref
from typing import Any, Deque, Iterator, List, Optional

import numpy as np

from tensorxfer.errors import ClosedError, PeerLostError
from tensorxfer.ipc.remote import protocol
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
_CREDIT_WAIT = datetime.timedelta(days=7)  # a learner may back-pressure for long; its death closes the pair


def _check_index(value: Any, name: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 0 <= int(value) < high:
        raise ValueError(f"{name} must be in [0, {high}), got {int(value)}")
    return int(value)


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
        self._states: List[str] = [_FREE] * info.credits
        self._sending: List[Any] = [None] * info.credits
        self._send_order: List[int] = [0] * info.credits
        self._credits = 0
        self._sequence = 0
        self._lost: Optional[str] = None
        self._closed = False
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._headers: Deque[Any] = collections.deque()  # header sends in flight (they hold their tensors)
        self._last_send = time.monotonic()
        self._stop = threading.Event()
        self._credit_thread = threading.Thread(target=self._receive_credits, daemon=True,
                                               name="tensorxfer-remote-credits")
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, daemon=True,
                                                  name="tensorxfer-remote-heartbeat")
        self._credit_thread.start()
        self._heartbeat_thread.start()
        _OPEN.add(self)

    @classmethod
    def connect(cls, init_method: Optional[str] = None, *, name: Optional[str] = None, timeout: float = 30.0,
                key: str = "ring") -> "RemoteSlotRing":
        """Join the learner's ring served at ``init_method`` (``"tcp://HOST:PORT"``, ``"env://"`` or ``None``:
        ``MASTER_ADDR``/``MASTER_PORT``).  ``name`` labels this producer in the learner's errors
        (default ``host:pid``).  Raises ``TimeoutError``/``RuntimeError`` if no learner answers within
        ``timeout``, ``PeerLostError`` if it has closed.  A producer that died may connect again: it
        is a new session."""
        import torch.distributed as dist

        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < 86400:
            raise ValueError(f"timeout must be seconds in (0, 86400), got {timeout!r}")
        host = socket.gethostname()
        name = f"{host}:{os.getpid()}" if name is None else name
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty str, got {name!r}")
        prefix = protocol.store_prefix(key)
        store, address = open_store(init_method, serve=False, timeout=float(timeout))
        info = RingInfo.decode(store.get(prefix + "info"))
        if store.check([prefix + "closed"]):
            raise PeerLostError(f"the learner at {address} has closed its ring {info.ring!r}")
        session = int(store.add(prefix + "joins", 1))
        record = JoinRecord(session, name, host, os.getpid())
        store.set(f"{prefix}join/{session}", record.encode())
        group = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}session/{session}/", store), 1, 2,
                                      datetime.timedelta(seconds=timeout))
        return cls(store, group, info, record, address)

    # ---- properties -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Slots this producer may have in flight: the learner's credits."""
        return self._info.credits

    @property
    def slot_nbytes(self) -> int:
        """Bytes per slot (the learner ring's)."""
        return self._info.slot_nbytes

    @property
    def name(self) -> str:
        return self.record.name

    # ---- the producer calls -----------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("remote ring is closed")
        if self._lost is not None:
            raise PeerLostError(self._lost)

    def acquire_free(self, timeout: Optional[float] = None) -> int:
        """A slot to write: waits for a credit from the learner (its back-pressure).  ``timeout``:
        seconds or ``None``; ``TimeoutError`` when it passes, ``PeerLostError`` when the learner
        closed or its link broke."""
        deadline = None if timeout is None else time.monotonic() + _check_timeout(timeout)
        with self._cond:
            while True:
                self._check_usable()
                if self._credits > 0:
                    slot = self._take_buffer_locked()
                    if slot is not None:
                        self._credits -= 1
                        self._states[slot] = _HELD
                        return slot
                remaining = _SLICE_S if deadline is None else min(_SLICE_S, deadline - time.monotonic())
                if remaining <= 0:
                    raise TimeoutError(f"RemoteSlotRing.acquire_free: no credit from the learner at "
                                       f"{self.init_method} within {timeout:g} s ({self.depth} slots in flight)")
                self._cond.wait(remaining)

    def _take_buffer_locked(self) -> Optional[int]:
        for slot, state in enumerate(self._states):
            if state == _FREE:
                return slot
        # A credit, and every buffer still sending: the learner posted a receive for each of them,
        # so the oldest is done or nearly (torch's Work reports completion only through wait()).
        sending = [slot for slot, state in enumerate(self._states) if state == _SENDING]
        if not sending:
            return None
        slot = min(sending, key=lambda index: self._send_order[index])
        self._finish_send(slot)
        return slot

    def _finish_send(self, slot: int) -> None:
        work, self._sending[slot] = self._sending[slot], None
        try:
            work.wait(datetime.timedelta(seconds=self._info.timeout))
        except Exception as error:  # noqa: BLE001 - a failed send is a broken link
            self._mark_lost(f"the link to the learner at {self.init_method} broke while sending: "
                            f"{str(error).splitlines()[0]}")
            raise PeerLostError(self._lost) from None
        finally:
            self._states[slot] = _FREE

    def slot_array(self, slot: int) -> np.ndarray:
        """The slot's bytes as a writable ``numpy.uint8`` array (``slot_nbytes`` long)."""
        return self._buffers[_check_index(slot, "slot", self.depth)]

    def slot_tensor(self, slot: int) -> Any:
        """The slot as a ``torch.uint8`` tensor (shares memory with :meth:`slot_array`)."""
        return self._tensors[_check_index(slot, "slot", self.depth)]

    def publish(self, slot: int, tick_id: int, nbytes: Optional[int] = None) -> None:
        """Send the slot to the learner, labelled ``tick_id`` (0..2**64-1); it reaches the learner's
        ``acquire_ready`` whole, after this producer's earlier slots.  ``nbytes``: send only the first
        ``nbytes`` (1..slot_nbytes; default all).  ``ValueError`` for a slot not held, a tick id or
        ``nbytes`` out of range (nothing is sent, the slot stays held); ``PeerLostError`` if the
        learner is gone."""
        import torch

        slot = _check_index(slot, "slot", self.depth)
        if isinstance(tick_id, bool) or not isinstance(tick_id, (int, np.integer)):
            raise TypeError(f"tick_id must be an int, got {type(tick_id).__name__} {tick_id!r}")
        if not 0 <= int(tick_id) < 2**64:
            raise ValueError(f"tick_id must be in [0, 2**64), got {int(tick_id)}")
        count = self.slot_nbytes if nbytes is None else nbytes
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            raise TypeError(f"nbytes must be an int, got {type(count).__name__} {count!r}")
        if not 1 <= int(count) <= self.slot_nbytes:
            raise ValueError(f"nbytes must be in [1, {self.slot_nbytes}] (a slot holds {self.slot_nbytes} bytes), "
                             f"got {int(count)}")
        with self._cond:
            self._check_usable()
            if self._states[slot] != _HELD:
                raise ValueError(f"RemoteSlotRing.publish: slot {slot} is not held for writing "
                                 f"({self._states[slot]}); publish only slots from acquire_free, once")
            header = torch.tensor([protocol.KIND_DATA, self._sequence, protocol.tick_to_wire(int(tick_id)),
                                   int(count)], dtype=torch.int64)
            try:
                with self._send_lock:
                    self._headers.append(self._group.send([header], 0, protocol.TAG_HEADER))
                    self._sending[slot] = self._group.send([self._tensors[slot][:int(count)]], 0, protocol.TAG_DATA)
                    self._last_send = time.monotonic()
                    self._reap_headers()
            except Exception as error:  # noqa: BLE001 - the pair is broken
                self._mark_lost(f"the link to the learner at {self.init_method} broke: {str(error).splitlines()[0]}")
                raise PeerLostError(self._lost) from None
            self._states[slot] = _SENDING
            self._send_order[slot] = self._sequence
            self._sequence += 1

    def abandon(self, slot: int) -> None:
        """Hand a slot from :meth:`acquire_free` back unpublished (its credit is kept for the next one)."""
        slot = _check_index(slot, "slot", self.depth)
        with self._cond:
            if self._states[slot] != _HELD:
                raise ValueError(f"RemoteSlotRing.abandon: slot {slot} is not held for writing ({self._states[slot]})")
            self._states[slot] = _FREE
            self._credits += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self, tick_id: int, timeout: Optional[float] = None) -> Iterator[int]:
        """As :meth:`SlotRing.writing`: publish on success, abandon on an exception."""
        slot = self.acquire_free(timeout)
        try:
            yield slot
        except BaseException:
            if not self._closed and self._lost is None:
                self.abandon(slot)
            raise
        self.publish(slot, tick_id)

    # ---- threads ----------------------------------------------------------------------

    def _reap_headers(self) -> None:
        """Keeps at most 8 header sends in flight (each holds its tensor until it completes; torch's
        Work reports completion only through wait(), which is immediate for a header already written)."""
        while len(self._headers) > 8:
            self._headers.popleft().wait(datetime.timedelta(seconds=self._info.timeout))

    def _mark_lost(self, reason: str) -> None:
        with self._cond:
            if self._lost is None:
                self._lost = reason
            self._cond.notify_all()

    def _receive_credits(self) -> None:
        import torch

        credit = torch.zeros(1, dtype=torch.int64)
        while not self._stop.is_set():
            try:
                self._group.recv([credit], 0, protocol.TAG_CREDIT).wait(_CREDIT_WAIT)
            except Exception as error:  # noqa: BLE001 - the pair closed
                if not self._stop.is_set():
                    self._mark_lost(f"the link to the learner at {self.init_method} broke: "
                                    f"{str(error).splitlines()[0]}")
                return
            count = int(credit.item())
            if count == protocol.CREDIT_CLOSE:
                self._mark_lost(f"the learner at {self.init_method} closed its ring {self._info.ring!r}")
                self._send_header(protocol.KIND_BYE)
                return
            with self._cond:
                self._credits += count
                self._cond.notify_all()

    def _send_header(self, kind: int) -> None:
        import torch

        header = torch.tensor([kind, 0, 0, 0], dtype=torch.int64)
        try:
            with self._send_lock:
                self._headers.append(self._group.send([header], 0, protocol.TAG_HEADER))
                self._last_send = time.monotonic()
                self._reap_headers()
        except Exception:  # noqa: BLE001 - the credit thread reports a broken pair
            pass

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
            lost = self._lost is not None
        if not lost:
            for work in [work for work in self._sending if work is not None]:
                try:
                    work.wait(datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
                except Exception:  # noqa: BLE001 - the learner is gone: nothing more to deliver
                    break
            self._send_header(protocol.KIND_BYE)
            for work in list(self._headers):
                try:
                    work.wait(datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
                except Exception:  # noqa: BLE001
                    break
        self._stop.set()
        _OPEN.discard(self)
        group, self._group = self._group, None
        group.abort()  # the credit receive fails now, and its thread ends
        self._credit_thread.join(5.0)
        self._heartbeat_thread.join(5.0)
        self._headers.clear()
        self._sending = [None] * self.depth
        self._store = None

    def __enter__(self) -> "RemoteSlotRing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("lost" if self._lost else "open")
        return f"RemoteSlotRing(name={self.name!r}, learner={self.init_method!r}, depth={self.depth}, {state})"


def _check_timeout(timeout: Any) -> float:
    from tensorxfer.errors import check_timeout

    checked = check_timeout(timeout, "RemoteSlotRing.acquire_free")
    return 0.0 if checked is None else checked
