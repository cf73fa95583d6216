"""SlotRing producer entries are reused: a collector pool that re-attaches every
epoch keeps working; and closing in a fork()ed child while another thread of
the parent waits on the ring does not hang."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from tensorxfer.ipc import SlotRing

EPOCHS_PER_WORKER = 250
WORKERS = 2


def reattach_every_epoch(handle, worker: int, epochs: int) -> None:
    """A collector that attaches, publishes one batch and closes, every epoch."""
    for epoch in range(epochs):
        with SlotRing.attach(handle) as ring:
            with ring.writing(tick_id=worker << 32 | epoch, timeout=10.0) as slot:
                ring.slot_array(slot)[:8] = worker


def test_ten_thousand_attach_close_cycles_on_four_entries():
    with SlotRing.create(depth=2, slot_nbytes=64, max_producers=4, spin_us=0) as consumer:
        handle = consumer.handle
        for epoch in range(10_000):
            with SlotRing.attach(handle, spin_us=0) as producer:
                producer.publish(producer.acquire_free(timeout=1.0), tick_id=epoch)
            slot, tick = consumer.acquire_ready(timeout=1.0)
            assert tick == epoch
            consumer.release(slot)
        assert consumer.live_producers == 0


@pytest.mark.multiprocess
def test_a_pool_that_reattaches_every_epoch_keeps_working():
    # Fewer entries than the attaches of one epoch's pool over its life: the old
    # ring refused the (max_producers + 1)-th attach.
    with SlotRing.create(depth=4, slot_nbytes=64, max_producers=WORKERS) as consumer:
        context = multiprocessing.get_context("fork")
        workers = [
            context.Process(target=reattach_every_epoch, args=(consumer.handle, worker, EPOCHS_PER_WORKER))
            for worker in range(WORKERS)
        ]
        for process in workers:
            process.start()
        try:
            seen = {worker: [] for worker in range(WORKERS)}
            for _ in range(WORKERS * EPOCHS_PER_WORKER):
                slot, tick = consumer.acquire_ready(timeout=20.0)
                seen[tick >> 32].append(tick & 0xFFFFFFFF)
                consumer.release(slot)
            for process in workers:
                process.join(timeout=20.0)
                assert process.exitcode == 0
        finally:
            for process in workers:
                if process.is_alive():
                    process.kill()
                    process.join()
        assert seen == {worker: list(range(EPOCHS_PER_WORKER)) for worker in range(WORKERS)}


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_child_forked_while_a_thread_waits_closes_and_exits():
    consumer = SlotRing.create(depth=1, slot_nbytes=64, spin_us=1_000_000)
    producer = SlotRing.attach(consumer.handle, spin_us=1_000_000)
    producer.acquire_free(timeout=1.0)  # full: the waiters below keep waiting
    stop = threading.Event()

    def wait_on(ring, consume):
        while not stop.is_set():
            try:
                if consume:
                    ring.acquire_ready(timeout=0.05)
                else:
                    ring.acquire_free(timeout=0.05)
            except TimeoutError:
                pass

    threads = [threading.Thread(target=wait_on, args=(consumer, True)),
               threading.Thread(target=wait_on, args=(producer, False))]
    for thread in threads:
        thread.start()
    hung = 0
    try:
        time.sleep(0.02)
        for _ in range(10):
            pid = os.fork()
            if pid == 0:  # the child: close the parent's rings and leave
                try:
                    producer.close()
                    consumer.close()
                finally:
                    os._exit(0)
            deadline = time.monotonic() + 3.0
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.005)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert hung == 0, f"{hung} of 10 forked children hung closing the ring"
    assert not consumer.closed and consumer.live_producers == 1  # the children did not close ours
    producer.close()
    consumer.close()
