"""SlotRing: a ring of fixed-size shared-memory slots between processes.

Several producers, one consumer (the process that created the ring)::

    ring = SlotRing.create(depth=4, slot_nbytes=N)      # consumer
    peer = SlotRing.attach(ring.handle)                  # in a producer process
    slot = peer.acquire_free(timeout=1.0)
    peer.slot_array(slot)[:] = ...                       # zero-copy numpy uint8 view
    peer.publish(slot, tick_id=7)                        # or peer.abandon(slot): hand it back unpublished
    with peer.writing(tick_id=8, timeout=1.0) as slot:   # publishes on success, abandons on an exception
        peer.slot_array(slot)[:] = ...
    slot, tick_id = ring.acquire_ready(timeout=1.0)      # slots come out in publish order
    ring.release(slot)
    ring.close()

On an open ring, ``acquire_free``, ``publish``, ``acquire_ready`` and
``release`` are the native calls themselves, with no Python frame around them
(they are a hand-off's critical path); they check their arguments as the
methods below document.

Waits release the GIL.  How they spend their time is set by ``spin_us``:

* ``None`` (the default): the standard policy of every tensorxfer wait.
  While the producer and the consumer fit the CPUs, a wait spins for up to
  2 ms (pausing, then pausing and yielding the CPU now and then), then sleeps
  in the kernel; when processes waiting on each other outnumber the CPUs it
  spins only 20 us, yielding the CPU from the start, then sleeps, so a
  spinning waiter never starves the peer it waits for (yielding first hands
  the CPU to a peer that is runnable on it without a kernel wake-up: 2-3x
  faster than sleeping at once for 4 ranks on 2 CPUs).
  (An adaptive predictor of arrivals was measured against it in the handoff
  benchmark and deleted: it never won by the 1.5x its complexity had to earn.)
* ``0``: never spin: the least CPU; each hand-off pays the kernel wake-up
  (tens of microseconds on a virtual machine).
* ``x > 0``: spin ``x`` microseconds, then sleep.

``wait_stats`` says which policy a handle's waits follow.
A wait's ``timeout`` follows the package rules (:mod:`tensorxfer.errors`):
seconds, ``0`` to try once, ``None`` for no deadline.  Whatever the timeout, a
wait raises ``tensorxfer.PeerLostError`` when the other side has died and
``KeyboardInterrupt`` on Ctrl-C (both checked at least every 20 ms, with
nothing taken from the ring), so a killed peer never hangs a process; it
raises ``TimeoutError`` when its timeout passes.  Liveness is read from record
locks each side holds on the ring's shared-memory file, not from pids, so it
holds between containers that share ``/dev/shm`` but not a PID namespace.
Slots held for writing by a dead producer are reclaimed.  The shared-memory
name is removed when the consumer closes the ring or exits, or when a survivor
notices the consumer died.

``max_producers`` bounds how many producers are attached at once: a producer
that closes (or dies) frees its entry for the next, so a pool of workers may
re-attach every epoch for as long as it likes.

Slot views (``slot_array`` / ``slot_tensor`` / ``slot_arrays``) keep the
mapping alive, so they never dangle; but after ``close()`` they are detached
from the ring: writes to them reach no one.  Drop them before closing.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple, Union

import numpy as np

from tensorxfer import _core
from tensorxfer._resource import SharedResource

__all__ = ["SlotRing", "SlotRingHandle"]

_MAX_TICK_ID = 2**64
# The calls on a hand-off's critical path. An open ring binds them straight to its
# native ring, which checks their arguments as the methods below document (a plain
# int in range natively, anything else through _check_int): a Python frame around
# each cost about 0.2 us warm and more than 1 us per hand-off after a producer's sleep.
_NATIVE_CALLS = ("acquire_free", "publish", "acquire_ready", "release")


@dataclass(frozen=True)
class SlotRingHandle:
    """What another process needs to attach to a ring: small and picklable.

    Works with every multiprocessing start method (spawn, fork, forkserver).
    """

    name: str
    depth: int
    slot_nbytes: int


def _check_int(value: Any, name: str, low: int, high: Optional[int] = None) -> int:
    if type(value) is int and value >= low and (high is None or value < high):
        return value  # the common case, without the (slow) ABC checks below
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low or (high is not None and value >= high):
        bounds = f"be in [{low}, {high})" if high is not None else f"be >= {low}"
        raise ValueError(f"{name} must {bounds}, got {value}")
    return value


def _check_spin(spin_us: Optional[float]) -> Optional[float]:
    if spin_us is None:
        return None
    if isinstance(spin_us, bool) or not isinstance(spin_us, numbers.Real):
        raise TypeError(f"spin_us must be None (the standard policy) or microseconds, got {type(spin_us).__name__}")
    spin_us = float(spin_us)
    if math.isnan(spin_us) or spin_us < 0 or spin_us > 1_000_000:
        raise ValueError(f"spin_us must be None (the standard policy) or in [0, 1000000] microseconds, got {spin_us}")
    return spin_us


class SlotRing(SharedResource):
    """A ring of ``depth`` shared slots of ``slot_nbytes`` bytes each.

    Build it with :meth:`create` (the consumer) or :meth:`attach` (a producer);
    the constructor is not public.  Usable as a context manager (closes on exit).
    Waits follow ``spin_us`` (by default the standard policy: spin up to 2 ms
    while the processes fit the CPUs, else yield 20 us, then sleep; see the module docstring).
    """

    _kind = "ring"
    _share_hint = "pass ring.handle and call SlotRing.attach(handle)"

    def __init__(self, core: Any) -> None:
        self._core = core
        self._closed = False
        for call in _NATIVE_CALLS:  # until close(): the methods of the same names below are then used
            setattr(self, call, getattr(core, call))

    # ---- construction ---------------------------------------------------------

    @classmethod
    def create(
        cls,
        depth: int,
        slot_nbytes: int,
        *,
        spin_us: Optional[float] = None,
        max_producers: int = 64,
    ) -> "SlotRing":
        """Creates a ring in a new shared-memory segment; this process is its consumer.

        Args:
            depth: the number of slots, 1..1024.
            slot_nbytes: bytes per slot (each slot starts on a 4096-byte boundary).
            spin_us: how waits spend their time (see the module docstring): ``None`` is
                the standard policy, ``0`` never spins, ``x > 0`` spins ``x``
                microseconds before sleeping.
            max_producers: how many producers may be attached at once (1..255); entries
                of producers that closed or died are reused.

        Returns:
            The ring; pass its :attr:`handle` to producers. Close it (or use it as a
            context manager): that removes its name from ``/dev/shm``.

        Raises:
            ValueError: an argument out of range.
            TypeError: an argument that is not an int (``spin_us``: a number or None).
            OSError: the segment could not be made (``errno`` set, e.g. ``ENOSPC`` when
                ``/dev/shm`` is full).

        Example:
            >>> with SlotRing.create(depth=2, slot_nbytes=4096) as ring:
            ...     ring.depth, ring.slot_nbytes, ring.is_consumer
            (2, 4096, True)
        """
        depth = _check_int(depth, "depth", 1, 1025)
        slot_nbytes = _check_int(slot_nbytes, "slot_nbytes", 1)
        max_producers = _check_int(max_producers, "max_producers", 1, 256)
        return cls(_core.SlotRing.create(depth, slot_nbytes, _check_spin(spin_us), max_producers))

    @classmethod
    def attach(cls, handle: Union[SlotRingHandle, str], *, spin_us: Optional[float] = None) -> "SlotRing":
        """Attaches to an existing ring as a producer.

        Args:
            handle: the consumer's ``ring.handle`` (or the ring's name).
            spin_us: as for :meth:`create`; each handle has its own.

        Raises:
            tensorxfer.CorruptSegmentError: the segment fails validation or does not match
                the handle.
            tensorxfer.PeerLostError: the consumer has exited or closed the ring.
            FileNotFoundError: the ring no longer exists.
            ValueError: ``max_producers`` producers are attached now.
        """
        if isinstance(handle, SlotRingHandle):
            name = handle.name
        elif isinstance(handle, str):
            name = handle
        else:
            raise TypeError(f"handle must be a SlotRingHandle or a ring name, got {type(handle).__name__}")
        ring = cls(_core.SlotRing.attach(name, _check_spin(spin_us)))
        if isinstance(handle, SlotRingHandle) and (handle.depth, handle.slot_nbytes) != (ring.depth, ring.slot_nbytes):
            got = (ring.depth, ring.slot_nbytes)
            ring.close()
            from tensorxfer.errors import CorruptSegmentError

            raise CorruptSegmentError(
                f"ring {name}: segment has (depth, slot_nbytes) = {got}, "
                f"expected {(handle.depth, handle.slot_nbytes)} from the handle"
            )
        return ring

    # ---- properties -----------------------------------------------------------

    def _live(self) -> Any:
        self._ensure_open()
        return self._core

    @property
    def handle(self) -> SlotRingHandle:
        """A small picklable handle for :meth:`attach` in another process."""
        core = self._live()
        return SlotRingHandle(core.name, core.depth, core.slot_nbytes)

    @property
    def name(self) -> str:
        """The shared-memory name (``/tensorxfer-<pid>-<random>``)."""
        return self._core.name

    @property
    def depth(self) -> int:
        """Number of slots."""
        return self._core.depth

    @property
    def slot_nbytes(self) -> int:
        """Bytes per slot."""
        return self._core.slot_nbytes

    @property
    def is_consumer(self) -> bool:
        """True for the ring's creator (the one process that may acquire_ready / release)."""
        return self._core.is_consumer

    @property
    def spin_us(self) -> Optional[float]:
        """The fixed spin budget in microseconds before a wait sleeps; ``None`` means the standard policy (the default)."""
        return self._core.spin_us

    @spin_us.setter
    def spin_us(self, value: Optional[float]) -> None:
        self._live().spin_us = _check_spin(value)

    @property
    def current_spin_us(self) -> float:
        """How long a wait starting now spins before it first sleeps, in microseconds."""
        return self._core.current_spin_us

    @property
    def wait_stats(self) -> dict:
        """The policy this handle's waits follow, for diagnostics.

        ``{"policy": "standard" | "fixed", "spin_us": budget in microseconds}``.
        """
        return self._live().wait_stats

    @property
    def live_producers(self) -> int:
        """Producers attached now, attaching or active and alive; a diagnostic that costs one system call each."""
        return self._live().live_producers

    @property
    def skipped_sequences(self) -> int:
        """Publish sequences skipped because their producer died before publishing."""
        return self._core.skipped_sequences

    @property
    def last_publish_ns(self) -> int:
        """``time.monotonic_ns()`` at which the slot last returned by :meth:`acquire_ready` was published."""
        return self._core.last_publish_ns

    # ---- producer -------------------------------------------------------------

    def acquire_free(self, timeout: Optional[float] = None) -> int:
        """Takes a free slot for writing and returns its index.

        Args:
            timeout: seconds (``0``: try once), or ``None`` for no deadline.

        Raises:
            TimeoutError: ``timeout`` passed.
            tensorxfer.PeerLostError: the consumer died or closed the ring.
            KeyboardInterrupt: Ctrl-C, also with ``timeout=None``; no slot is taken then.
        """
        return self._live().acquire_free(timeout)

    def try_acquire_free(self) -> Optional[int]:
        """A free slot's index, or ``None`` at once if none is free."""
        return self._live().try_acquire_free()

    def publish(self, slot: int, tick_id: int) -> None:
        """Hand a slot from :meth:`acquire_free` to the consumer, labelled ``tick_id`` (0..2**64-1).

        Raises ``ValueError`` if the slot is out of range or not held by this
        handle for writing (e.g. published twice).
        """
        self._live().publish(slot, tick_id)

    def abandon(self, slot: int) -> None:
        """Hand a slot from :meth:`acquire_free` back without publishing it.

        For a producer that fails after acquiring: the slot becomes free for
        any producer and the consumer never sees it.  Raises ``ValueError`` if
        the slot is out of range or not held by this handle for writing (e.g.
        already published or abandoned).
        """
        core = self._live()
        core.abandon(_check_int(slot, "slot", 0, core.depth))

    @contextlib.contextmanager
    def writing(self, tick_id: int, timeout: Optional[float] = None) -> Iterator[int]:
        """Acquire a free slot for the ``with`` block; publish it as ``tick_id`` when the block succeeds.

        ::

            with ring.writing(tick_id=7, timeout=1.0) as slot:
                ring.slot_array(slot)[:n] = batch

        If the block raises (``KeyboardInterrupt`` included), the slot is
        abandoned (handed back unpublished) and the exception propagates.
        ``timeout`` applies to acquiring the slot, as in :meth:`acquire_free`.
        Raises ``TypeError``/``ValueError`` for a bad ``tick_id`` before acquiring.
        """
        tick_id = _check_int(tick_id, "tick_id", 0, _MAX_TICK_ID)
        slot = self.acquire_free(timeout)
        try:
            yield slot
        except BaseException:
            if not self._closed:  # close() already handed the slot back
                self.abandon(slot)
            raise
        self.publish(slot, tick_id)

    # ---- consumer -------------------------------------------------------------

    def acquire_ready(self, timeout: Optional[float] = None) -> Tuple[int, int]:
        """Returns the next published slot, in publish order, as ``(slot, tick_id)``. Consumer only.

        Args:
            timeout: seconds (``0``: try once), or ``None`` for no deadline.

        Raises:
            TimeoutError: ``timeout`` passed.
            tensorxfer.PeerLostError: every producer that attached is gone, at least one
                of them died without closing, and nothing is ready. (If all producers
                closed cleanly another may attach, so the wait goes on.)
            KeyboardInterrupt: Ctrl-C, also with ``timeout=None``; nothing is taken then.
        """
        return self._live().acquire_ready(timeout)

    def try_acquire_ready(self) -> Optional[Tuple[int, int]]:
        """Like :meth:`acquire_ready` without waiting: ``(slot, tick_id)`` or ``None``."""
        return self._live().try_acquire_ready()

    def release(self, slot: int) -> None:
        """Give a slot from :meth:`acquire_ready` back to the producers. Consumer only.

        Raises ``ValueError`` if out of range or not held by the consumer.
        """
        self._live().release(slot)

    def report_peer_lost(self, message: str) -> None:
        """Makes the next :meth:`acquire_ready` raise ``tensorxfer.PeerLostError(message)`` once.

        A call waiting now raises it too; it takes nothing. Consumer only; thread-safe.

        For a relay that publishes into this ring on behalf of producers the ring
        cannot watch itself (:class:`tensorxfer.ipc.remote.RemoteProducers` reports a lost
        remote producer this way): the learner hears of the loss within its wait,
        and its next call goes on with the slots and producers that remain.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        self._live().report_peer_lost(message)

    # ---- views ----------------------------------------------------------------

    def slot_array(self, slot: int) -> np.ndarray:
        """Zero-copy ``numpy.uint8`` view of one slot (``slot_nbytes`` long, 4096-aligned)."""
        core = self._live()
        return core.slot_array(_check_int(slot, "slot", 0, core.depth))

    def slot_arrays(self) -> List[np.ndarray]:
        """Zero-copy views of every slot, by index."""
        core = self._live()
        return [core.slot_array(slot) for slot in range(core.depth)]

    def slot_tensor(self, slot: int) -> Any:
        """Zero-copy ``torch.uint8`` CPU tensor of one slot (needs torch)."""
        import torch

        return torch.from_numpy(self.slot_array(slot))

    # ---- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Detaches from the ring. Idempotent.

        A producer returns the slots it holds for writing; the consumer closes the ring
        (waiting producers get ``PeerLostError``) and removes its name. Afterwards every
        method raises ``ClosedError("ring is closed")`` (a ``ValueError``).
        """
        super().close()

    def _release(self) -> None:
        for call in _NATIVE_CALLS:
            self.__dict__.pop(call, None)
        self._core.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("consumer" if self.is_consumer else "producer")
        return f"SlotRing(name={self.name!r}, depth={self.depth}, slot_nbytes={self.slot_nbytes}, {state})"
