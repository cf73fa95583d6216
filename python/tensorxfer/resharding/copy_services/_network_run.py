"""A persistent plan's run between hosts: every stream at once, peers watched, one verdict (private).

A run of this rank's part (:class:`NetworkRun`):

* **Streams.** Each of this rank's roles (_network_plan.Role) runs as a generator that posts
  messages on the engine and yields each one it must wait for. A sender packs message k+1
  (natively, GIL released) while k is on the wire, into staging buffer (k+1) % depth,
  after waiting for the send that last used it. A receiver keeps ``depth`` receives
  posted ahead, unpacks each message as it arrives and, in a chain, forwards it from
  where it landed (its staging buffer or its own destination) before unpacking. Every
  stream starts with a 24-byte header (plan, version, stream): a receiver checks it
  before any byte of the run lands, so ranks running different plans or versions fail
  without writing a destination.
* **Peers watched.** Every rank tells every other one that it started the run (START),
  that it is alive while the run lasts (a TICK every :data:`TICK_SECONDS`) and how it
  ended (END: landed, or failed and why, naming the rank it lost). A run lands when this
  rank's streams are done and every peer ended well. A peer whose connection closes is
  lost at once; one that started but went silent for ``silence`` seconds (its host died
  or its link was cut) is lost then, well within the timeout; one that never started
  (it did not call run()) is waited for until the deadline.
* **Drivers.** gloo's work cannot be polled, so on a blocking engine every stream and
  every peer's watch waits on a thread of its own (daemon threads kept by the run); on a
  polled engine (MPI) the calling thread advances all of them. The same-host part (the
  shm plan) runs on a thread either way; the calling thread keeps the verdict.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Tuple

import numpy as np

from tensorxfer.errors import PeerLostError
from tensorxfer.resharding.copy_services._network_engines import LinkError, LinkLost, LinkTimeout
from tensorxfer.resharding.copy_services._network_plan import Role

#: Tags of a plan's messages, relative to the plan's own tags (see _network_engines): peers'
#: status messages, then one per stream.
STATUS_TAG = 0
STREAM_TAG_BASE = 1
#: After a failure: how long to wait for the peers to take this rank's END (so they learn
#: why), and for the run's jobs to end once the connections are released.
FAREWELL_SECONDS = 0.5
JOIN_SECONDS = 0.2
#: At exit: a job still waiting whose deadline is this close is waited for (so that it does
#: not wake up inside the interpreter's shutdown, which kills the process).
EXIT_GRACE_SECONDS = 3.0
#: After a failure seen on a connection: how long to wait for a peer's report of the rank really lost.
REPORT_GRACE_SECONDS = 0.1
#: A rank in a run tells every peer it is alive this often.
TICK_SECONDS = 0.25
# Status message kinds, and why a run failed (in an END).
START, TICK, END_LANDED, END_FAILED = 1, 2, 3, 4
LOST, SILENT, TIMEOUT, REFUSED, FAILED = 1, 2, 3, 4, 5
_REASONS = {LOST: "was lost", SILENT: "went silent", TIMEOUT: "did not take part in time",
            REFUSED: "refused the run (ranks run different plans or versions)", FAILED: "failed"}


class RunRefused(RuntimeError):
    """A header or status of another plan or version arrived: ranks run different plans."""


@dataclass
class Wait:
    """What a job yields: the request it waits for, and the peer at the other end."""

    request: Any
    peer: int


Job = Generator[Wait, None, None]


@dataclass
class StreamPart:
    """One role with everything its runs need, made once at build: the native messages
    (packs / unpacks), each message's engine buffer, and the header buffers."""

    role: Role
    messages: Any  # _core.StreamMessages
    buffers: List[Any]  # message k's engine buffer (its direct memory, or a staging buffer's first bytes)
    shares_buffer: np.ndarray  # bool per message: staged (reuses staging buffer k % depth)
    depth: int
    header_out: Any  # engine buffer of 24 bytes, and a numpy uint64 view of it
    header_out_words: np.ndarray
    header_in: Any
    header_in_words: np.ndarray


def host_name(host_of: Sequence[int], rank: int) -> str:
    return f"rank {rank} (host {host_of[rank]})" if 0 <= rank < len(host_of) else f"rank {rank}"


class NetworkRun:
    """This rank's part of a plan between hosts; :meth:`run` is collective over the whole group."""

    def __init__(self, engine: Any, copy_engine: Any, rank: int, world_size: int, host_of: Sequence[int],
                 parts: List[StreamPart], plan_id: int, silence: Optional[float] = None) -> None:
        self.engine = engine
        self.copy_engine = copy_engine
        self.rank = rank
        self.world_size = world_size
        self.host_of = list(host_of)
        self.parts = parts
        self.plan_id = plan_id
        self.silence = silence
        self.peers = [peer for peer in range(world_size) if peer != rank]
        self._watches = {peer: _Watch([self._words(4), self._words(4)]) for peer in self.peers}
        self._jobs = _Threads(len(parts) + len(self.peers) + 1)
        self._keep: List[Any] = []  # requests and buffers of a failed run, alive while the engine may use them

    def _words(self, count: int) -> Tuple[Any, np.ndarray]:
        buffer, _ = self.engine.staging(8 * count)
        return buffer, self.engine.as_numpy(buffer)[:8 * count].view(np.uint64)

    def close(self) -> None:
        self._jobs.close()
        self.engine.close()

    # ---- a run --------------------------------------------------------------------

    def run(self, version: int, timeout: Optional[float],
            local_work: Optional[Callable[[Optional[float]], None]] = None) -> None:
        """Moves this rank's streams and, on a thread, its host's part (``local_work(deadline)``);
        returns once every rank's part landed. Raises PeerLostError naming the lost rank and
        its host, TimeoutError naming the ranks that did not take part, RunRefused, or the
        error of this rank's own part; then no job of the run is left running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        silence = self.silence if self.silence is not None else _silence_for(timeout)
        events: "queue.Queue[Tuple[Any, str, Any]]" = queue.Queue()
        jobs: Dict[Any, Job] = {}
        for part in self.parts:
            part.header_out_words[:] = (self.plan_id, version, part.role.stream.index)
            jobs[("stream", part.role.stream.index)] = self._stream_job(part, version)
        for peer in self.peers:
            jobs[("watch", peer)] = self._watch_job(peer, version, events)
        own = {key for key in jobs if key[0] == "stream"}
        if local_work is not None:
            own.add(("local", 0))
            self._jobs.start(("local", 0), local_work, deadline, events)
        status_sends: List[Tuple[Any, int, Any]] = []
        verdict = _Verdict(self, own, silence)
        polled: Dict[Any, Tuple[Job, Optional[Wait]]] = {}
        try:
            self._send_status(status_sends, version, START, 0)
            if self.engine.blocking:
                for key, job in jobs.items():
                    self._jobs.start(key, _blocking_driver(job, self.engine, deadline), deadline, events)
            else:
                polled = {key: (job, None) for key, job in jobs.items()}
            self._until_landed(verdict, events, polled, status_sends, version, deadline, timeout)
            # A peer's watch job ends just after its END arrived: wait for it to finish
            # here, so that no job of this run is still returning when the caller goes on.
            self._jobs.join(JOIN_SECONDS)
        except BaseException as error:
            cause = verdict.root_cause(verdict.as_error(error), events)
            self._fail(cause, verdict, polled, status_sends, version)
            if cause is error:
                raise
            raise cause from error

    def _until_landed(self, verdict: "_Verdict", events: "queue.Queue[Tuple[Any, str, Any]]",
                      polled: Dict[Any, Tuple[Job, Optional[Wait]]], status_sends: List[Tuple[Any, int, Any]],
                      version: int, deadline: Optional[float], timeout: Optional[float]) -> None:
        """The calling thread's loop: events in, ticks and the END out, until every part landed."""
        next_tick = time.monotonic() + TICK_SECONDS
        while not verdict.landed():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise verdict.timeout_error(timeout)
            moved = self._advance(polled, events) if polled else False
            try:
                key, outcome, detail = events.get(timeout=0 if polled else _wait_slice(deadline, next_tick))
                verdict.take(key, outcome, detail, timeout)
            except queue.Empty:
                pass
            if verdict.own_done() and not verdict.end_sent:
                self._send_status(status_sends, version, END_LANDED, 0)
                verdict.end_sent = True
            now = time.monotonic()
            if now >= next_tick and not verdict.end_sent:
                self._send_status(status_sends, version, TICK, 0)
                next_tick = now + TICK_SECONDS
            verdict.check_silence(now)
            if polled and not moved:
                time.sleep(0.0002)
        for request, peer, _ in status_sends:  # every peer has taken them by now
            self._wait_status(request, peer, deadline)

    def _fail(self, error: BaseException, verdict: "_Verdict", polled: Dict[Any, Tuple[Job, Optional[Wait]]],
              status_sends: List[Tuple[Any, int, Any]], version: int) -> None:
        """A failed run: tells every peer why (END_FAILED, naming the lost rank), then ends
        every job of the run. A gloo wait cannot be cancelled: the blocking engine closes its
        connections (``release``), which ends every pending wait at once."""
        self._keep.append((status_sends, polled))  # buffers the engine may still touch
        if not verdict.end_sent:
            lost, reason = verdict.blame(error)
            ends: List[Tuple[Any, int, Any]] = []
            try:
                self._send_status(ends, version, END_FAILED, (reason << 32) | (lost + 1))
            except Exception:  # noqa: BLE001 - telling the peers is best effort
                pass
            self._keep.append(ends)
            tell_until = time.monotonic() + FAREWELL_SECONDS
            for request, peer, _ in ends:  # so that the peers learn why before the connections close
                try:
                    self.engine.wait(request, peer, tell_until)
                except LinkError:
                    break  # a timed-out gloo wait has closed every connection already
        for _, waiting in polled.values():
            if waiting is not None:
                self.engine.abandon(waiting.request)
        if self._jobs.running():
            for peer in self.peers:  # a wait that times out closes every connection; a closed one fails at once
                if self.engine.release(peer):
                    break
            # Jobs whose message was on the wire when its peer died are never woken by gloo:
            # they end at the run's deadline (see _Threads, and _end_before_exit).
            self._jobs.join(JOIN_SECONDS)

    def _wait_status(self, request: Any, peer: int, deadline: Optional[float]) -> None:
        try:
            self.engine.wait(request, peer, deadline)
        except LinkLost as error:
            raise PeerLostError(f"{host_name(self.host_of, peer)} was lost: {error}") from error
        except LinkTimeout as error:
            raise TimeoutError(f"{host_name(self.host_of, peer)} did not take the run's end in time") from error

    def _send_status(self, sends: List[Tuple[Any, int, Any]], version: int, kind: int, detail: int) -> None:
        for peer in self.peers:
            buffer, words = self._words(4)
            words[:] = (self.plan_id, version, kind, detail)
            sends.append((self.engine.send(buffer, peer, STATUS_TAG), peer, buffer))

    def _advance(self, polled: Dict[Any, Tuple[Job, Optional[Wait]]],
                 events: "queue.Queue[Tuple[Any, str, Any]]") -> bool:
        """One pass over the polled jobs: resumes each whose request completed."""
        moved = False
        for key in list(polled):
            job, waiting = polled[key]
            try:
                if waiting is not None and not self.engine.test(waiting.request, waiting.peer):
                    continue
                polled[key] = (job, next(job))
                moved = True
            except StopIteration:
                del polled[key]
                events.put((key, "done", None))
                moved = True
            except BaseException as error:  # noqa: BLE001 - reported as the job's failure
                del polled[key]
                events.put((key, "failed", error))
                moved = True
        return moved

    # ---- jobs -----------------------------------------------------------------------

    def _stream_job(self, part: StreamPart, version: int) -> Job:
        role, engine, tag = part.role, self.engine, STREAM_TAG_BASE + part.role.stream.index
        count, depth = len(part.buffers), part.depth
        if role.upstream is None:  # the sender: sends[0] is the header, sends[k + 1] message k
            downstream = role.downstream
            assert downstream is not None
            sends: List[Any] = [engine.send(part.header_out, downstream, tag)]
            waited = 0
            for k in range(count):
                if part.shares_buffer[k]:
                    while waited <= k - depth + 1:  # up to message k - depth, the buffer's last user
                        yield Wait(sends[waited], downstream)
                        waited += 1
                part.messages.copy(k, self.copy_engine)
                sends.append(engine.send(part.buffers[k], downstream, tag))
            for request in sends[waited:]:
                yield Wait(request, downstream)
            return
        upstream, downstream = role.upstream, role.downstream
        assert upstream is not None
        header = engine.recv(part.header_in, upstream, tag)
        yield Wait(header, upstream)
        expected = (self.plan_id, version, role.stream.index)
        got = tuple(int(word) for word in part.header_in_words)
        if got != expected:
            raise RunRefused(f"rank {upstream} runs plan {got[0]:#x} version {got[1]} (stream {got[2]}), rank "
                             f"{self.rank} runs plan {expected[0]:#x} version {version} (stream {expected[2]})")
        forwards: List[Any] = []  # forwards[0] is the header, forwards[k + 1] message k
        forwarded = 0
        if downstream is not None:
            forwards.append(engine.send(part.header_out, downstream, tag))
        receives = [engine.recv(part.buffers[k], upstream, tag) for k in range(min(depth, count))]
        for k in range(count):
            yield Wait(receives[k], upstream)
            if downstream is not None:
                forwards.append(engine.send(part.buffers[k], downstream, tag))
            part.messages.copy(k, self.copy_engine)
            ahead = k + depth
            if ahead < count:
                if downstream is not None and part.shares_buffer[ahead]:
                    while forwarded <= k + 1:  # every forward that may still read that buffer
                        yield Wait(forwards[forwarded], downstream)
                        forwarded += 1
                receives.append(engine.recv(part.buffers[ahead], upstream, tag))
        for request in forwards[forwarded:]:
            yield Wait(request, downstream if downstream is not None else upstream)

    def _watch_job(self, peer: int, version: int, events: "queue.Queue[Tuple[Any, str, Any]]") -> Job:
        """A peer's status messages, with two receives always posted (also between runs), so
        that a peer's farewell finds one waiting: START and TICKs say it is alive, the END
        how its run ended."""
        watch = self._watches[peer]
        if watch.pending is None:
            watch.pending = [self.engine.recv(watch.buffers[k][0], peer, STATUS_TAG) for k in range(2)]
        while True:
            slot = watch.next % 2
            yield Wait(watch.pending[slot], peer)
            plan_id, their_version, kind, detail = (int(word) for word in watch.buffers[slot][1])
            watch.pending[slot] = self.engine.recv(watch.buffers[slot][0], peer, STATUS_TAG)
            watch.next += 1
            if (plan_id, their_version) != (self.plan_id, version):
                raise RunRefused(f"rank {peer} runs plan {plan_id:#x} version {their_version}, rank {self.rank} "
                                 f"runs plan {self.plan_id:#x} version {version}")
            if kind in (START, TICK):
                events.put((("watch", peer), "alive", None))
                continue
            events.put((("watch", peer), "ended", (kind, detail)))
            return


@dataclass
class _Watch:
    """What this rank keeps of a peer's status messages between runs: two buffers, the two
    receives posted into them, and which one the next message lands in."""

    buffers: List[Tuple[Any, np.ndarray]]
    pending: Optional[List[Any]] = None
    next: int = 0


class _Verdict:
    """What the calling thread knows of a run: which parts are done, which peers started,
    were last heard from, and ended; and, from that, whether the run landed or why not."""

    def __init__(self, run: NetworkRun, own: set, silence: float) -> None:
        self.run = run
        self.own_pending = set(own)
        self.silence = silence
        self.started: Dict[int, float] = {}  # peer -> when it was last heard from
        self.ended: Dict[int, Tuple[int, int]] = {}
        self.end_sent = False

    def own_done(self) -> bool:
        return not self.own_pending

    def landed(self) -> bool:
        return self.end_sent and len(self.ended) == len(self.run.peers)

    def take(self, key: Any, outcome: str, detail: Any, timeout: Optional[float]) -> None:
        kind, who = key
        if outcome == "failed":
            if isinstance(detail, LinkTimeout):  # the deadline: name who never took part, if anyone
                raise self.timeout_error(timeout) from detail
            raise self._failure(detail) from detail
        if outcome == "alive":
            self.started[who] = time.monotonic()
        elif outcome == "ended":
            status, why = detail
            if status == END_FAILED:
                raise self._reported(who, why)
            self.ended[who] = detail
        elif outcome == "done" and kind != "watch":
            self.own_pending.discard(key)

    def as_error(self, error: BaseException) -> BaseException:
        """A LinkError (an engine's) as the error the caller sees; any other error as it is."""
        return self._failure(error) if isinstance(error, LinkError) else error

    def _failure(self, error: BaseException) -> BaseException:
        if isinstance(error, LinkLost):
            return lost_error(self.run.host_of, error.peer, f"was lost: {error}")
        if isinstance(error, LinkTimeout):
            return TimeoutError(f"{host_name(self.run.host_of, error.peer)} did not deliver within the timeout")
        return error

    def _reported(self, reporter: int, why: int) -> BaseException:
        reason, lost = why >> 32, (why & 0xFFFFFFFF) - 1
        names = self.run.host_of
        what = _REASONS.get(reason, "failed")
        if lost >= 0 and reason in (LOST, SILENT, TIMEOUT):
            return lost_error(names, lost, f"{what} (reported by {host_name(names, reporter)})")
        return RuntimeError(f"{host_name(names, reporter)} {what}")

    def root_cause(self, error: BaseException, events: "queue.Queue[Tuple[Any, str, Any]]") -> BaseException:
        """``error``, or a peer's report of a lost rank that arrives within moments: a peer
        that failed first closes its connections, so a rank may see *that peer* vanish,
        while the peer's END, sent before, names the rank really lost."""
        if not isinstance(error, (PeerLostError, TimeoutError)):
            return error
        until = time.monotonic() + REPORT_GRACE_SECONDS
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return error
            try:
                key, outcome, detail = events.get(timeout=left)
            except queue.Empty:
                return error
            if outcome == "ended" and detail[0] == END_FAILED:
                report = self._reported(key[1], detail[1])
                if isinstance(report, PeerLostError) and getattr(report, "lost_rank", -1) != self.run.rank:
                    return report

    def check_silence(self, now: float) -> None:
        for peer, heard in self.started.items():
            if peer not in self.ended and now - heard > self.silence:
                raise lost_error(self.run.host_of, peer, f"went silent for {now - heard:.1f} s during the run: its "
                                 "host or its link was lost", silent=True)

    def timeout_error(self, timeout: Optional[float]) -> TimeoutError:
        absent = [peer for peer in self.run.peers if peer not in self.started and peer not in self.ended]
        names = self.run.host_of
        waited = "no deadline" if timeout is None else f"{timeout:g} s"
        if absent:
            who = ", ".join(host_name(names, peer) for peer in absent)
            error = TimeoutError(f"{who} did not take part in the run within {waited} (run() not called, "
                                 "or its host unreachable)")
            error.lost_rank = absent[0]  # type: ignore[attr-defined]
            return error
        pending = [peer for peer in self.run.peers if peer not in self.ended]
        who = ", ".join(host_name(names, peer) for peer in pending) or "this rank's own transfers"
        return TimeoutError(f"the run did not finish within {waited}: waiting on {who}")

    def blame(self, error: BaseException) -> Tuple[int, int]:
        """(lost rank or -1, reason) to tell the peers about this rank's failure."""
        lost = getattr(error, "lost_rank", -1)
        if isinstance(error, PeerLostError):
            return lost, SILENT if getattr(error, "silent", False) else LOST
        if isinstance(error, TimeoutError):
            return lost, TIMEOUT
        if isinstance(error, RunRefused):
            return -1, REFUSED
        return -1, FAILED


def lost_error(host_of: Sequence[int], rank: int, what: str, silent: bool = False) -> PeerLostError:
    """PeerLostError naming ``rank`` and its host, carrying the rank (``lost_rank``)."""
    error = PeerLostError(f"{host_name(host_of, rank)} {what}")
    error.lost_rank = rank  # type: ignore[attr-defined]
    error.silent = silent  # type: ignore[attr-defined]
    return error


def _silence_for(timeout: Optional[float]) -> float:
    """How long a started peer may stay silent before it counts as lost."""
    if timeout is None:
        return 10.0
    return max(2.0, min(timeout / 4, 10.0))


def _wait_slice(deadline: Optional[float], next_tick: float) -> float:
    now = time.monotonic()
    until = next_tick if deadline is None else min(next_tick, deadline)
    return min(max(until - now, 0.0), 0.05)


def _blocking_driver(job: Job, engine: Any, deadline: Optional[float]) -> Callable[[Optional[float]], None]:
    def drive(_: Optional[float]) -> None:
        for wait in job:
            engine.wait(wait.request, wait.peer, deadline)
    return drive


_live_threads: "weakref.WeakSet[_Threads]" = weakref.WeakSet()


def _end_before_exit() -> None:
    """At exit, before the interpreter shuts down: lets the jobs of failed runs that will
    soon reach their deadline end first. A daemon thread that returns from a native wait
    while the interpreter shuts down aborts the process (pybind11 cannot unwind it); one
    whose deadline is far is still blocked when the process ends, and so never returns.
    Then ends and joins every idle thread, so that none returns during the shutdown."""
    for threads in list(_live_threads):
        left = threads.latest_deadline() - time.monotonic()
        if threads.running() and left < EXIT_GRACE_SECONDS:
            threads.join(max(left, 0.0) + 0.5)
        threads.close()


atexit.register(_end_before_exit)


class _Threads:
    """Daemon threads that run a run's jobs, one thread per job, kept between runs."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._work: "queue.Queue[Optional[Tuple[Any, Callable, Optional[float], queue.Queue]]]" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._busy = 0
        self._idle = threading.Condition()
        self._deadlines: Dict[Any, float] = {}
        _live_threads.add(self)

    def start(self, key: Any, body: Callable[[Optional[float]], None], deadline: Optional[float],
              events: "queue.Queue[Tuple[Any, str, Any]]") -> None:
        while len(self._threads) < self._count:
            thread = threading.Thread(target=self._serve, name="tensorxfer-plan", daemon=True)
            thread.start()
            self._threads.append(thread)
        with self._idle:
            self._busy += 1
            self._deadlines[key] = float("inf") if deadline is None else deadline
        self._work.put((key, body, deadline, events))

    def running(self) -> int:
        """Jobs started and not finished."""
        with self._idle:
            return self._busy

    def latest_deadline(self) -> float:
        """The latest deadline of the jobs still running (-inf: none runs)."""
        with self._idle:
            return max(self._deadlines.values(), default=float("-inf"))

    def join(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for every started job to finish; whether they did."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            key, body, deadline, events = item
            outcome: Tuple[str, Any] = ("done", None)
            try:
                body(deadline)
            except BaseException as error:  # noqa: BLE001 - the run's thread raises it
                outcome = ("failed", error)
            # The job's requests die here, before the job counts as finished: a gloo Work
            # freed by a daemon thread after the interpreter began to shut down aborts the
            # process (its destructor releases the GIL, and the thread cannot take it back).
            item = body = None  # type: ignore[assignment]
            events.put((key, *outcome))
            with self._idle:
                self._busy -= 1
                self._deadlines.pop(key, None)
                self._idle.notify_all()

    def close(self, timeout: float = JOIN_SECONDS) -> None:
        """Ends the threads: those idle return at once and are joined (so that none is still
        returning while the interpreter shuts down); one blocked in a failed run's native
        wait is left to its deadline."""
        threads, self._threads = self._threads, []
        for _ in threads:
            self._work.put(None)
        if self.running():
            return
        until = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(until - time.monotonic(), 0.0))
