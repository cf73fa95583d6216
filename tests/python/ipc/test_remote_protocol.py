"""The remote-ring protocol's decoders fed with arbitrary messages (Hypothesis): what a producer,
a learner, or anything that reached the port may send.  Each decoder returns a checked value or
raises ProtocolError (a ValueError), whatever the bytes; well-formed messages round-trip.  This is
the Python side's fuzz target (tests/fuzz/README.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings, strategies as st

from tensorxfer.ipc.remote import protocol
from tensorxfer.ipc.remote.protocol import JoinRecord, ProtocolError, RingInfo, Verdict

INT64 = st.integers(-2**63, 2**63 - 1)
ANY_INT = st.one_of(INT64, st.integers())
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children,
                                                                                      max_size=4),
                    max_leaves=12)


def records(fields: dict) -> st.SearchStrategy:
    """JSON objects built around ``fields``'s names, each value sometimes right, sometimes anything."""
    values = {name: st.one_of(st.just(value), JSON) for name, value in fields.items()}
    return st.fixed_dictionaries({}, optional=values).map(lambda d: json.dumps(d).encode())


MESSAGES = st.one_of(st.binary(max_size=64), JSON.map(lambda value: json.dumps(value).encode()),
                     st.binary(min_size=protocol.MAX_RECORD_BYTES + 1, max_size=protocol.MAX_RECORD_BYTES + 2),
                     st.text(max_size=30))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(ANY_INT, max_size=6), st.lists(st.one_of(ANY_INT, st.booleans(), st.floats()), max_size=5)),
       st.integers(0, 2**40), st.integers(1, 2**40))
@example([protocol.KIND_DATA, 0, -1, 64], 0, 64)
@example([protocol.KIND_DATA, 0, 0, 65], 0, 64)
@example([protocol.KIND_DATA, 0, 0, 0], 0, 64)
@example([True, 0, 0, 1], 0, 64)
def test_decode_header_returns_a_checked_header_or_refuses(words, expected, slot_nbytes):
    try:
        header = protocol.decode_header(words, expected, slot_nbytes)
    except ProtocolError:
        return
    assert header.kind in (protocol.KIND_DATA, protocol.KIND_HEARTBEAT, protocol.KIND_BYE)
    if header.kind == protocol.KIND_DATA:
        assert header.sequence == expected
        assert 1 <= header.nbytes <= slot_nbytes
        assert 0 <= header.tick_id < 2**64
        assert protocol.tick_to_wire(header.tick_id) == words[2]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**20), st.integers(1, 2**20))
def test_a_data_header_round_trips(tick_id, sequence, nbytes):
    words = [protocol.KIND_DATA, sequence, protocol.tick_to_wire(tick_id), nbytes]
    assert protocol.decode_header(words, sequence, nbytes) == protocol.Header(protocol.KIND_DATA, sequence, tick_id,
                                                                              nbytes)


@settings(max_examples=400, deadline=None)
@given(st.one_of(MESSAGES, records({"ring": "r", "slot_nbytes": 64, "credits": 2, "timeout": 5.0,
                                    "protocol": protocol.PROTOCOL_VERSION})))
def test_ring_info_decodes_or_refuses(raw):
    try:
        info = RingInfo.decode(raw)
    except ProtocolError:
        return
    assert isinstance(info.ring, str) and 0 < len(info.ring) <= 256
    assert 1 <= info.slot_nbytes <= 2**40 and 1 <= info.credits <= 1024 and 1e-3 <= info.timeout <= 86400


@settings(max_examples=400, deadline=None)
@given(st.one_of(MESSAGES, records({"name": "collector", "host": "h", "pid": 7, "protocol": 3, "nonce": "ab"})),
       st.integers(1, 2**40))
def test_join_record_decodes_or_refuses(raw, session):
    try:
        record = JoinRecord.decode(session, raw)
    except ProtocolError:
        return
    assert record.session == session
    assert isinstance(record.name, str) and 0 < len(record.name) <= 256
    assert isinstance(record.host, str) and 0 < len(record.host) <= 256
    assert 0 <= record.pid < 2**31 and isinstance(record.protocol, int) and not isinstance(record.protocol, bool)
    assert len(record.nonce) <= 128 and set(record.nonce) <= set("0123456789abcdef")


@settings(max_examples=300, deadline=None)
@given(st.one_of(MESSAGES, records({"admitted": True, "reason": "", "proof": "00"})))
def test_verdict_decodes_or_refuses(raw):
    try:
        verdict = protocol.decode_verdict(raw)
    except ProtocolError:
        return
    assert isinstance(verdict.admitted, bool) and isinstance(verdict.reason, str) and isinstance(verdict.proof, str)


@given(st.text(min_size=1, max_size=256), st.text(min_size=1, max_size=256), st.integers(0, 2**31 - 1),
       st.text("0123456789abcdef", max_size=128), st.integers(1, 2**40))
def test_well_formed_records_round_trip(name, host, pid, nonce, session):
    record = JoinRecord(session, name, host, pid, nonce=nonce)
    assert JoinRecord.decode(session, record.encode()) == record
    info = RingInfo("tensorxfer-1-ab", 4096, 2, 5.0)
    assert RingInfo.decode(info.encode()) == info
    verdict = Verdict(False, reason=name, proof=nonce)
    assert protocol.decode_verdict(verdict.encode()) == verdict


def test_refusals_name_what_is_wrong():
    with pytest.raises(ProtocolError, match="announced 65 bytes for a slot of 64 bytes"):
        protocol.decode_header([protocol.KIND_DATA, 0, 0, 65], 0, 64)
    with pytest.raises(ProtocolError, match="sent slot sequence 3, expected 2"):
        protocol.decode_header([protocol.KIND_DATA, 3, 0, 1], 2, 64)
    with pytest.raises(ProtocolError, match="unknown kind 9"):
        protocol.decode_header([9, 0, 0, 0], 0, 64)
    with pytest.raises(ProtocolError, match="speaks remote-ring protocol 2, this producer 3"):
        RingInfo.decode(json.dumps({"ring": "r", "slot_nbytes": 8, "credits": 1, "timeout": 1.0,
                                    "protocol": 2}).encode())
    with pytest.raises(ProtocolError, match="more than the 4096 a record may have"):
        JoinRecord.decode(1, b"{" + b" " * 5000 + b"}")
    with pytest.raises(ProtocolError, match="not JSON"):
        JoinRecord.decode(1, b"\xff\xfe")
    with pytest.raises(ProtocolError, match="pid must be an integer"):
        JoinRecord.decode(1, json.dumps({"name": "a", "host": "b", "pid": "1"}).encode())
    assert issubclass(ProtocolError, ValueError)
