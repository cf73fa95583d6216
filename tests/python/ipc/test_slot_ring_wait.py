"""SlotRing waits: the standard (default) policy and a fixed one, that waits end on time and
on publish, and the handoff benchmark's consumer-CPU measurement."""

from __future__ import annotations

import threading
import time

import pytest

from tensorxfer.benchmarks import handoff
from tensorxfer.ipc import SlotRing

PERIOD_S = 0.002
BATCHES = 80


def _publish_periodically(ring: SlotRing, count: int, period_s: float, started: threading.Event) -> None:
    with SlotRing.attach(ring.handle) as producer:
        started.set()
        deadline = time.monotonic()
        for tick in range(count):
            deadline += period_s
            time.sleep(max(0.0, deadline - time.monotonic()))
            slot = producer.acquire_free(timeout=5.0)
            producer.publish(slot, tick_id=tick)


def _consume(ring: SlotRing, count: int) -> list[int]:
    ticks = []
    for _ in range(count):
        slot, tick = ring.acquire_ready(timeout=5.0)
        ticks.append(tick)
        ring.release(slot)
    return ticks


def _run_periodic(ring: SlotRing, count: int = BATCHES) -> list[int]:
    started = threading.Event()
    thread = threading.Thread(target=_publish_periodically, args=(ring, count, PERIOD_S, started))
    thread.start()
    try:
        assert started.wait(10.0)
        return _consume(ring, count)
    finally:
        thread.join(10.0)


def test_the_default_policy_spins_milliseconds_while_the_processes_fit_the_cpus():
    import os

    with SlotRing.create(depth=4, slot_nbytes=64) as ring:
        assert ring.spin_us is None
        assert _run_periodic(ring) == list(range(BATCHES))
        stats = ring.wait_stats
    assert stats["policy"] == "standard"
    expected = 2000.0 if len(os.sched_getaffinity(0)) >= 2 else 0.0  # a producer and a consumer
    assert stats["spin_us"] == expected


def test_a_fixed_spin_is_reported_as_set():
    with SlotRing.create(depth=4, slot_nbytes=64, spin_us=0) as ring:
        assert _run_periodic(ring, 20) == list(range(20))
        assert ring.wait_stats == {"policy": "fixed", "spin_us": 0.0}
        ring.spin_us = 150
        assert ring.wait_stats == {"policy": "fixed", "spin_us": 150.0}
        ring.spin_us = None
        assert ring.wait_stats["policy"] == "standard"


def test_a_spinning_wait_still_times_out_on_time_and_ends_on_a_publish():
    with SlotRing.create(depth=4, slot_nbytes=64) as ring:
        _run_periodic(ring)
        # Nothing more comes: the wait ends at its timeout (spin, then sleep).
        begin = time.monotonic()
        with pytest.raises(TimeoutError):
            ring.acquire_ready(timeout=0.05)
        assert 0.049 <= time.monotonic() - begin < 1.0
        # A publish after the spin budget (asleep by then) still ends the wait at once.
        with SlotRing.attach(ring.handle) as producer:
            timer = threading.Timer(0.02, lambda: producer.publish(producer.acquire_free(timeout=5.0), 99))
            begin = time.monotonic()
            timer.start()
            slot, tick = ring.acquire_ready(timeout=5.0)
            waited = time.monotonic() - begin
            timer.join()
            ring.release(slot)
    assert tick == 99
    assert waited < 0.5


def test_wait_stats_of_a_closed_ring_raise():
    ring = SlotRing.create(depth=2, slot_nbytes=8)
    ring.close()
    with pytest.raises(ValueError, match="closed"):
        _ = ring.wait_stats


@pytest.mark.multiprocess
def test_handoff_bench_reports_what_the_consumer_waits_cost():
    # A 1 ms spin outlasts every 0.5 ms gap: the consumer wants a core all the time,
    # whatever the machine's load (yielding to other work, it stays runnable). How
    # much CPU it then gets depends on that load, so only the demand is compared.
    spinning = handoff.measure_consumer_cost("slot_ring_spin", 40, 0.0005, 5)
    sleeping = handoff.measure_consumer_cost("slot_ring_nospin", 40, 0.0005, 5)
    for cost in (spinning, sleeping):
        assert len(cost.latencies_us) == 40 and all(lat > 0 for lat in cost.latencies_us)
        assert 0.0 <= cost.cpu_percent <= 110.0 and cost.cpu_us_per_batch >= 0.0
        assert cost.demand_percent is not None, "this kernel has no /proc/<pid>/task/<tid>/schedstat"
        assert cost.demand_percent <= 101.0
    assert spinning.demand_percent > 60.0
    assert sleeping.demand_percent < 30.0  # each 0.5 ms gap is slept through
    # A sleeping waiter costs microseconds per batch, not the gap it waited out.
    assert sleeping.cpu_us_per_batch < 250.0
