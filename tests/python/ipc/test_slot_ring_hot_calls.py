"""The calls on a hand-off's critical path (acquire_free, publish, acquire_ready, release).

An open ring binds them straight to the native ring: no Python frame runs for
plain int arguments, and anything else is checked exactly as every other
tensorxfer int argument is (``_check_int``: the same exception types and
messages).
"""

import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tensorxfer.errors import ClosedError
from tensorxfer.ipc import SlotRing
from tensorxfer.ipc.slot_ring import _check_int

DEPTH = 4


@pytest.fixture
def pair():
    ring = SlotRing.create(depth=DEPTH, slot_nbytes=64)
    producer = SlotRing.attach(ring.handle)
    yield ring, producer
    producer.close()
    ring.close()


def _python_calls(call, *args, **kwargs):
    """The Python functions entered while ``call(*args, **kwargs)`` runs (sys.setprofile 'call' events)."""
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = call(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return result, entered


def test_the_hot_calls_run_no_python_code(pair):
    ring, producer = pair
    producer.abandon(producer.acquire_free(timeout=1.0))  # the first wait looks up the main thread, once
    slot, entered = _python_calls(producer.acquire_free, timeout=1.0)
    assert entered == []
    assert _python_calls(producer.publish, slot, tick_id=9)[1] == []
    ready, entered = _python_calls(ring.acquire_ready, timeout=1.0)
    assert (ready, entered) == ((slot, 9), [])
    assert _python_calls(ring.release, slot)[1] == []


def test_closing_unbinds_them(pair):
    ring, producer = pair
    producer.close()
    for call in (lambda: producer.acquire_free(timeout=0.01), lambda: producer.publish(0, tick_id=1)):
        with pytest.raises(ClosedError, match="ring is closed"):
            call()
    ring.close()
    for call in (lambda: ring.acquire_ready(timeout=0.01), lambda: ring.release(0)):
        with pytest.raises(ClosedError, match="ring is closed"):
            call()


def test_last_publish_ns_is_the_time_of_the_slot_handed_out(pair):
    ring, producer = pair
    assert ring.last_publish_ns == 0
    stamps = []
    for tick in (1, 2):
        before = time.monotonic_ns()
        producer.publish(producer.acquire_free(timeout=1.0), tick_id=tick)
        stamps.append((before, time.monotonic_ns()))
    slot, _ = ring.acquire_ready(timeout=1.0)
    assert stamps[0][0] <= ring.last_publish_ns <= stamps[0][1]
    ring.release(slot)
    slot, _ = ring.try_acquire_ready()
    assert stamps[1][0] <= ring.last_publish_ns <= stamps[1][1]
    ring.release(slot)


def _outcome(check):
    """(value, None) or (None, (exception type, message)) of ``check()``."""
    try:
        return check(), None
    except (TypeError, ValueError) as error:
        return None, (type(error), str(error))


# Plain ints far outside every range, numpy integers, bools, floats and other objects.
_ARGUMENTS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=DEPTH),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -1]),
    st.builds(lambda kind, value: kind(value), st.sampled_from([np.int64, np.uint8, np.int32, np.uint64]),
              st.integers(min_value=0, max_value=DEPTH)),
    st.booleans(),
    st.floats(allow_nan=False, min_value=-2.0, max_value=5.0),
    st.sampled_from(["1", None, 1 + 0j]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slot_argument=_ARGUMENTS, tick_argument=_ARGUMENTS, same_slot=st.booleans())
@example(slot_argument=True, tick_argument=1, same_slot=False)
@example(slot_argument=0, tick_argument=2**64 - 1, same_slot=True)
@example(slot_argument=0, tick_argument=2**63, same_slot=True)
@example(slot_argument=np.uint8(0), tick_argument=np.uint64(2**64 - 1), same_slot=True)
@example(slot_argument=1.0, tick_argument=1, same_slot=False)
def test_arguments_are_checked_as_check_int_checks_them(pair, slot_argument, tick_argument, same_slot):
    ring, producer = pair
    held = producer.acquire_free(timeout=1.0)
    if same_slot and type(slot_argument) is int and 0 <= slot_argument < DEPTH:
        slot_argument = held
    slot, slot_error = _outcome(lambda: _check_int(slot_argument, "slot", 0, DEPTH))
    tick, tick_error = _outcome(lambda: _check_int(tick_argument, "tick_id", 0, 2**64))
    expected_error = slot_error or tick_error
    if expected_error is not None:
        with pytest.raises(expected_error[0]) as raised:
            producer.publish(slot_argument, tick_id=tick_argument)
        assert str(raised.value) == expected_error[1]
        producer.abandon(held)
        return
    if slot != held:
        with pytest.raises(ValueError, match="not held by this producer"):
            producer.publish(slot_argument, tick_id=tick_argument)
        producer.abandon(held)
        return
    producer.publish(slot_argument, tick_id=tick_argument)
    assert ring.acquire_ready(timeout=1.0) == (held, tick)
    ring.release(slot_argument)  # the same argument, as release checks it
    with pytest.raises(ValueError, match="not held by the consumer"):
        ring.release(held)
