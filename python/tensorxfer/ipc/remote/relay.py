"""One admitted producer session's relay, run in a process of its own (``relay_host``).

It attaches to the learner's ring as a local producer and holds ``credits`` free ring
slots for its remote producer, with a receive posted straight into each: gloo lets the
producer's bytes leave only into a posted receive, so these receives are the producer's
credits.  When a slot's header arrives (after its bytes, on the same stream) the relay
publishes that slot, so ``acquire_ready`` never sees a slot before all its bytes are
there, and holds the next free slot.

Why a process: gloo's TCP pair aborts the whole process (``GLOO_ENFORCE`` in its I/O
thread, then ``std::terminate``) when a peer sends a message longer than the receive
posted for it, which any peer that speaks gloo can do.  In a process of its own such an
abort ends this session only; the ring reclaims the slots it held (a producer that
died), and the learner reports the loss.

What the relay tells the learner travels as :class:`Events`: JSON lines, each under
PIPE_BUF bytes so that lines of several relays sharing one pipe never interleave.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import threading
from typing import Any, Deque, Dict, List, Optional, Tuple

from tensorxfer.ipc.remote import protocol
from tensorxfer.ipc.remote.protocol import ProtocolError

_POLL_S = 0.02
_MAX_REASON = 1000


class _SessionEnded(Exception):
    """The relay stops without a loss to report (the producer said bye, or the learner closes)."""


class _ProtocolError(Exception):
    """The producer sent something the protocol does not allow."""


class Events:
    """Writes one session's events to a file descriptor shared with other relays."""

    def __init__(self, fd: int, session: int) -> None:
        self.fd = fd
        self.session = session
        self.lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"session": self.session, "event": event, **fields}).encode() + b"\n"
        assert len(line) < 4096, "an event line must fit PIPE_BUF"
        with self.lock:
            try:
                os.write(self.fd, line)
            except OSError:
                pass  # the learner is gone: nobody reads


class Relay:
    """The relay of session ``spec["session"]``; :meth:`run` returns when the session ends."""

    def __init__(self, spec: Dict[str, Any], events: Events) -> None:
        self.spec = spec
        self.events = events
        self.stopping = threading.Event()
        self.group: Any = None
        self.close_lock = threading.Lock()
        self.close_work: Any = None  # the CLOSE message's send (it holds its tensor)
        self.slots = 0
        self.bytes = 0
        # The error that ended the link, met while posting a receive: the slots whose header and
        # bytes gloo had already received are still published before the session ends with it.
        self.link_error: Optional[BaseException] = None

    def run(self) -> None:
        import torch
        import torch.distributed as dist

        from tensorxfer import _core
        from tensorxfer._tensor import native_view
        from tensorxfer.ipc.slot_ring import SlotRing

        spec = self.spec
        timeout = datetime.timedelta(seconds=spec["timeout"])
        proxy: Optional[SlotRing] = None
        state, reason = "lost", ""
        try:
            client = dist.TCPStore(spec["host"], spec["port"], is_master=False, wait_for_workers=False,
                                   timeout=timeout)
            store = dist.PrefixStore(f"{spec['prefix']}session/{spec['session']}/", client)
            self.group = dist.ProcessGroupGloo(store, 0, 2, timeout)
            del store, client
            proxy = SlotRing.attach(spec["ring"])
            arrays = [proxy.slot_array(slot) for slot in range(proxy.depth)]
            # gloo writes the producer's bytes through this new mapping: its page tables are made
            # now, not by a fault on every page of the first pass (contents unchanged: other
            # producers may be writing their slots).
            for array in arrays:
                _core.populate_host_pages(native_view(array, "slot"), "slot")
            views = [torch.from_numpy(array) for array in arrays]
            reserved: Deque[Tuple[int, Any]] = collections.deque()
            self.events.send("active")
            self.hold(proxy, views, reserved, spec["credits"])
            # A header receive posted for every slot the producer may send and two more (heartbeat,
            # bye): a header never waits for a receive, which would cost gloo a round trip.
            headers: Deque[Tuple[Any, Any]] = collections.deque()
            for _ in range(spec["credits"] + 2):
                self.post_header(headers, torch.zeros(protocol.HEADER_WORDS, dtype=torch.int64))
            expected_sequence = 0
            data_wait = timeout / 2
            while True:
                if not headers:  # only after the link broke: nothing more can arrive
                    raise self.link_error or RuntimeError("no header receive posted")
                buffer, pending = headers.popleft()
                pending.wait(timeout)
                try:
                    header = protocol.decode_header(buffer.tolist(), expected_sequence, spec["slot_nbytes"])
                except ProtocolError as error:
                    raise _ProtocolError(str(error)) from None
                if header.kind == protocol.KIND_HEARTBEAT:
                    self.post_header(headers, buffer)
                    continue
                if header.kind == protocol.KIND_BYE:
                    raise _SessionEnded("closed")
                if not reserved:
                    if self.link_error is not None:  # its credit was never posted: the link broke first
                        raise self.link_error
                    raise _ProtocolError("sent a slot without a credit")
                slot, received = reserved.popleft()
                # Every byte is in the slot after this wait.  They normally came before the header; they
                # come after it only when they waited for this receive.  gloo does not fail a receive
                # whose bytes are arriving when the link breaks (only those not started), so this wait
                # is the loss's backstop: half the timeout, so the loss is still reported within it.
                try:
                    received.wait(data_wait)
                except Exception as error:  # noqa: BLE001 - reported as what it means for this producer
                    raise RuntimeError(f"the bytes of its slot {header.sequence} stopped arriving for "
                                       f"{data_wait.total_seconds():g} s (its host died or its link broke: "
                                       f"{str(error).splitlines()[0]})") from None
                proxy.publish(slot, header.tick_id)
                # The hand-off is done: the bookkeeping comes after it.
                expected_sequence += 1
                self.slots += 1
                self.bytes += header.nbytes
                self.progress()
                self.post_header(headers, buffer)
                self.hold(proxy, views, reserved, 1)
        except _SessionEnded as ended:
            state, reason = "closed", str(ended)
        except _ProtocolError as error:
            reason = f"broke the protocol: it {error}"
        except (KeyboardInterrupt, SystemExit) as error:
            reason = f"relay interrupted ({type(error).__name__})"
        except BaseException as error:  # noqa: BLE001 - every failure of a session is that producer's loss
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        finally:
            self.finish(proxy)
        self.events.send("end", state=state, reason=reason[:_MAX_REASON], slots=self.slots, bytes=self.bytes)

    def progress(self) -> None:
        self.events.send("progress", slots=self.slots, bytes=self.bytes)

    def post_receive(self, tensor: Any, tag: int) -> Any:
        """A receive from the producer, or None once the link has broken (``link_error``).

        gloo refuses new receives on a broken pair; the receives it completed before stay
        complete, so the run loop still publishes the slots they finished.
        """
        if self.link_error is not None:
            return None
        try:
            return self.group.recv([tensor], 1, tag)
        except Exception as error:  # noqa: BLE001 - the pair is broken: the run loop ends with it
            self.link_error = error
            return None

    def post_header(self, headers: Deque[Tuple[Any, Any]], buffer: Any) -> None:
        pending = self.post_receive(buffer, protocol.TAG_HEADER)
        if pending is not None:
            headers.append((buffer, pending))

    def hold(self, proxy: Any, views: List[Any], reserved: Deque[Tuple[int, Any]], count: int) -> None:
        """Holds ``count`` more free ring slots for the producer (waiting for the learner to free them:
        the back-pressure) and posts a receive into each: each is a credit.  Once the link has broken
        it posts none (a slot already held goes back to the ring unpublished when the relay ends)."""
        for _ in range(count):
            if self.link_error is not None:
                return
            while True:
                if self.stopping.is_set():  # no more credits: the producer answers CLOSE with bye
                    self.request_close()
                    return
                try:
                    slot = proxy.acquire_free(timeout=_POLL_S)
                    break
                except TimeoutError:
                    continue
            received = self.post_receive(views[slot], protocol.TAG_DATA)
            if received is None:
                return
            reserved.append((slot, received))

    def request_close(self) -> None:
        """Tells the producer the learner closes: it answers bye (the relay still takes what it sent
        before, so the link closes with nothing unread), and its calls raise PeerLostError."""
        import torch

        self.stopping.set()
        if self.group is None:
            return  # still joining: hold() sends it once the group is up
        with self.close_lock:
            if self.close_work is not None:
                return
            try:
                self.close_work = self.group.send([torch.tensor([protocol.CONTROL_CLOSE], dtype=torch.int64)], 1,
                                                  protocol.TAG_CONTROL)
            except Exception:  # noqa: BLE001 - a producer already gone needs no notice
                self.close_work = False

    def finish(self, proxy: Any) -> None:
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


def listen_for_close(relay: Relay, control_fd: int) -> None:
    """Runs on a thread of the relay's process: any byte (or EOF) on ``control_fd`` is the learner
    closing; the relay then tells its producer."""
    try:
        os.read(control_fd, 1)
    except OSError:
        pass
    relay.request_close()
    # A relay still joining (no group yet) or waiting on the producer ends within its own timeouts.
