"""The demo learner: take each batch from the ring, move it to the device, compute, verify.

Per batch: ``acquire_ready`` -> ``submit_h2d`` into device slot ``step % depth``
-> compute on and verify the *previous* batch while that copy runs ->
``synchronize_ready`` (the only time the learner waits for the copy) ->
``release`` the host slot.  Every batch is checked against the store rows its
sample tick names, recomputed here independently of the collector.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from tensorxfer.demo import store as replay_store
from tensorxfer.errors import PeerLostError

_ACQUIRE_POLL_S = 0.2
_SYNC_TIMEOUT_S = 30.0
_HIDDEN_DIM = 32


@dataclasses.dataclass
class LearnerStats:
    """Raw measurements of one run (the summary is computed from these)."""

    batches: int = 0
    verified: int = 0
    elapsed_s: float = 0.0
    handoff_ns: List[int] = dataclasses.field(default_factory=list)  # local collectors' batches
    remote_handoff_ns: List[int] = dataclasses.field(default_factory=list)  # remote ones' (one clock: simulated hosts)
    per_collector: List[int] = dataclasses.field(default_factory=list)  # batches by collector id
    waiting_handoff_ns: List[int] = dataclasses.field(default_factory=list)
    submit_s: List[float] = dataclasses.field(default_factory=list)
    exposed_wait_s: List[float] = dataclasses.field(default_factory=list)
    compute_s: List[float] = dataclasses.field(default_factory=list)
    transfer_s: List[float] = dataclasses.field(default_factory=list)
    hidden_s: List[float] = dataclasses.field(default_factory=list)
    transfer_s_calibrated: float = 0.0
    checksum: float = 0.0


class Learner:
    """Consumes batches from ``ring`` through ``backend`` until a time or batch limit."""

    def __init__(self, *, ring: Any, store: Any, backend: Any, layout: Any, seed: int,
                 num_collectors: int, use_torch: bool,
                 collectors_alive: Callable[[], None], first_remote: Optional[int] = None) -> None:
        """``collectors_alive`` raises PeerLostError when a collector has exited; called every batch.
        Collectors ``first_remote`` and up are remote (their batches are counted apart)."""
        self.ring, self.store, self.backend, self.layout = ring, store, backend, layout
        self.seed, self.num_collectors = seed, num_collectors
        self.collectors_alive = collectors_alive
        self.depth = ring.depth
        self.rows = layout.rows
        self.payload = slice(replay_store.PAYLOAD_OFFSET, replay_store.PAYLOAD_OFFSET + layout.nbytes)
        self.headers = [ring.slot_array(i)[: replay_store.PAYLOAD_OFFSET].view(np.int64) for i in range(self.depth)]
        if use_torch:
            self.host_payloads = [ring.slot_tensor(i)[self.payload] for i in range(self.depth)]
            import torch

            slot_dtype: Any = torch.uint8
        else:
            self.host_payloads = [ring.slot_array(i)[self.payload] for i in range(self.depth)]
            slot_dtype = np.uint8
        backend.register_host_slots(list(self.host_payloads))
        self.device_slots = backend.allocate_device_slots(count=self.depth, shape=(layout.nbytes,),
                                                          dtype=slot_dtype)
        self.weights = np.random.default_rng([seed, 1 << 32]).standard_normal(
            (layout.fields["obs"][1][0], _HIDDEN_DIM), dtype=np.float32)
        self._torch_weights: Any = None
        self.store_arrays = store.arrays
        self.next_sequence = [0] * num_collectors
        self.first_remote = num_collectors if first_remote is None else first_remote
        self.stats = LearnerStats(per_collector=[0] * num_collectors)

    # -- measurement helpers -----------------------------------------------------
    def calibrate_transfer(self, repeats: int = 7) -> float:
        """Median seconds of one submit + wait with nothing else running (for the hidden share)."""
        scratch = self.backend.allocate_device_slots(count=1, shape=(self.layout.nbytes,),
                                                     dtype=self.device_slots[0].dtype)[0]
        source = self.host_payloads[0]
        samples = []
        for _ in range(repeats):
            begin = time.perf_counter()
            self.backend.submit_h2d(slot=0, dst=scratch, src=source)
            self.backend.synchronize_ready(0, timeout=_SYNC_TIMEOUT_S)
            samples.append(time.perf_counter() - begin)
        self.backend.clear_ready(0)
        self.stats.transfer_s_calibrated = float(np.median(samples))
        return self.stats.transfer_s_calibrated

    # -- the loop ------------------------------------------------------------------
    def run(self, *, seconds: float, max_batches: Optional[int], stall_timeout_s: float,
            on_batch: Optional[Callable[[LearnerStats], None]] = None) -> LearnerStats:
        """Runs until ``seconds`` have passed or ``max_batches`` were taken; verifies every batch."""
        stats = self.stats
        begin = time.perf_counter()
        last_batch = begin
        previous: Optional[tuple] = None
        while (max_batches is None or stats.batches < max_batches) and time.perf_counter() - begin < seconds:
            self.collectors_alive()
            wait_begin_ns = time.monotonic_ns()
            try:
                slot, tick = self.ring.acquire_ready(timeout=_ACQUIRE_POLL_S)
            except TimeoutError:
                if time.perf_counter() - last_batch > stall_timeout_s:
                    raise TimeoutError(f"no batch from any collector for {stall_timeout_s:g} s") from None
                continue
            except PeerLostError as error:
                self.collectors_alive()  # names the collector and its exit code when it can
                lost = "a remote collector is lost" if "remote producer" in str(error) else "every collector is gone"
                raise PeerLostError(f"{lost}: {error}") from error
            received_ns = time.monotonic_ns()
            last_batch = time.perf_counter()
            collector, publish_ns = self._check_header(slot, tick)
            stats.per_collector[collector] += 1
            if collector >= self.first_remote:
                stats.remote_handoff_ns.append(received_ns - publish_ns)
            else:
                stats.handoff_ns.append(received_ns - publish_ns)
                if publish_ns >= wait_begin_ns:  # published while the learner was already waiting
                    stats.waiting_handoff_ns.append(received_ns - publish_ns)
            device_slot = stats.batches % self.depth
            # The backend tracks the copy out of each host slot: the slot goes back to
            # the ring once that copy is done.
            metadata = self._metadata(stats.batches, tick, slot, device_slot)
            stats.submit_s.append(self.backend.submit_h2d(
                slot=slot, dst=self.device_slots[device_slot], src=self.host_payloads[slot],
                metadata=metadata, h2d_bytes=self.layout.nbytes, pack_layout="replay_demo",
                pack_executor="tensorxfer.pack_rows"))
            window_begin = time.perf_counter()
            if previous is not None:
                self._consume(*previous)  # overlaps the copy just submitted
            self._wait_for_copy(slot, time.perf_counter() - window_begin)
            self.ring.release(slot)
            previous = (device_slot, tick)
            stats.batches += 1
            if on_batch is not None:
                on_batch(stats)
        if previous is not None:
            self._consume(*previous)
        stats.elapsed_s = time.perf_counter() - begin
        return stats

    def _wait_for_copy(self, host_slot: int, window_s: float) -> None:
        """Waits for the copy and accounts how much of it the compute window hid.

        A copy already done when the compute step ends was hidden entirely (its
        length is taken as the calibrated one, at most the window).  Otherwise
        it ran for the whole window plus the exposed wait, of which the window
        was hidden.
        """
        stats = self.stats
        if self.backend.ready_query(host_slot):
            stats.exposed_wait_s.append(0.0)
            hidden = min(stats.transfer_s_calibrated, window_s)
            stats.transfer_s.append(hidden)
            stats.hidden_s.append(hidden)
            return
        wait_begin = time.perf_counter()
        self.backend.synchronize_ready(host_slot, timeout=_SYNC_TIMEOUT_S)
        exposed = time.perf_counter() - wait_begin
        stats.exposed_wait_s.append(exposed)
        stats.transfer_s.append(window_s + exposed)
        stats.hidden_s.append(window_s)

    def _metadata(self, tick_id: int, sample_tick: int, host_slot: int, device_slot: int) -> Any:
        """The upstream ``ReplayTickMetadata`` of one batch: the snapshot is the store's
        ``obs`` field, and ``sample_seed`` is the sample tick (the rows are
        ``store.batch_indices(base seed, sample_seed, sample_count, store rows)``)."""
        from tensorxfer.ipc.replay_pipelines.base import ReplayTickMetadata

        snapshot = self.store_arrays["obs"]
        return ReplayTickMetadata(
            tick_id=tick_id, snapshot_ptr=snapshot.ctypes.data, snapshot_size=snapshot.nbytes,
            sample_seed=sample_tick, sample_count=self.rows, batch_host_slot=host_slot,
            batch_gpu_slot=device_slot)

    def _check_header(self, slot: int, tick: int) -> tuple:
        header = self.headers[slot]
        if int(header[replay_store.HEADER_MAGIC]) != replay_store.HEADER_MAGIC_VALUE:
            raise replay_store.BatchMismatch(f"slot {slot} (tick {tick}) has no demo batch header")
        if int(header[replay_store.HEADER_TICK]) != tick or int(header[replay_store.HEADER_ROWS]) != self.rows:
            raise replay_store.BatchMismatch(
                f"slot {slot}: ring says tick {tick}, header says tick {int(header[replay_store.HEADER_TICK])} "
                f"with {int(header[replay_store.HEADER_ROWS])} rows (expected {self.rows})")
        collector, sequence = tick % self.num_collectors, tick // self.num_collectors
        if int(header[replay_store.HEADER_COLLECTOR]) != collector:
            raise replay_store.BatchMismatch(
                f"tick {tick} belongs to collector {collector}, header says {int(header[replay_store.HEADER_COLLECTOR])}")
        if sequence != self.next_sequence[collector]:
            raise replay_store.BatchMismatch(
                f"collector {collector} delivered its batch {sequence}, expected batch "
                f"{self.next_sequence[collector]}: a batch was lost, repeated or reordered")
        self.next_sequence[collector] += 1
        return collector, int(header[replay_store.HEADER_PUBLISH_NS])

    def _consume(self, device_slot: int, tick: int) -> None:
        """The compute step on a delivered batch, then its verification against the store."""
        begin = time.perf_counter()
        self.stats.checksum += self._compute(self.device_slots[device_slot])
        host_bytes = _to_host_numpy(self.device_slots[device_slot])
        indices = replay_store.batch_indices(self.seed, tick, self.rows, self.store_arrays["obs"].shape[0])
        replay_store.verify_batch(self.layout.unpack(host_bytes), self.store_arrays, indices, tick)
        self.stats.verified += 1
        self.stats.compute_s.append(time.perf_counter() - begin)

    def _compute(self, device_bytes: Any) -> float:
        offset = self.layout.offsets["obs"]
        obs_dim = self.weights.shape[0]
        nbytes = self.rows * obs_dim * 4
        if isinstance(device_bytes, np.ndarray):
            obs = device_bytes[offset:offset + nbytes].view(np.float32).reshape(self.rows, obs_dim)
            return float(np.maximum(obs @ self.weights, 0.0).mean())
        import torch

        if self._torch_weights is None:
            self._torch_weights = torch.from_numpy(self.weights).to(device_bytes.device)
        obs = device_bytes[offset:offset + nbytes].view(torch.float32).reshape(self.rows, obs_dim)
        return float(torch.relu(obs @ self._torch_weights).mean())


def _to_host_numpy(device_bytes: Any) -> np.ndarray:
    if isinstance(device_bytes, np.ndarray):
        return device_bytes
    return device_bytes.detach().cpu().numpy()


def percentiles_us(samples_ns: Sequence[int]) -> dict:
    """p50 / p99 in microseconds (None when there are no samples)."""
    if not samples_ns:
        return {"p50": None, "p99": None}
    values = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}
