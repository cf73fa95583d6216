"""What a remote producer and the learner's relay say to each other, and where they meet.

Each producer session is a two-rank gloo group (the learner rank 0, the producer
rank 1) made on the rendezvous store under ``<prefix>session/<n>/``; nothing else
travels outside torch.distributed point-to-point messages:

* Credits are gloo's own: a send leaves only once the receiver has posted a
  receive for it (gloo tells the sender "receive ready").  The learner posts a
  receive on tag :data:`TAG_DATA` only into a ring slot it holds for that producer,
  so the receives it has posted are the producer's credits, and no credit message
  of ours travels.
* producer -> learner, tag :data:`TAG_DATA`: a slot's first ``nbytes`` bytes, which
  land in the oldest ring slot held and not yet filled; then, tag
  :data:`TAG_HEADER`: four int64, ``(kind, sequence, tick_id, nbytes)`` of that
  slot (:data:`KIND_DATA`).  The bytes go first, so on one TCP stream the header
  arrives after them and the learner wakes once per slot.  Headers of kind
  :data:`KIND_HEARTBEAT` say "alive, nothing to send"; :data:`KIND_BYE` "closing".
* learner -> producer, tag :data:`TAG_CONTROL`: one int64, :data:`CONTROL_CLOSE`,
  sent once when the learner closes.

The store keys, under ``tensorxfer/remote-ring/<key>/``: ``info`` (the ring's
shape and the learner's timeout, JSON), ``joins`` (a counter: a producer's
``add(joins, 1)`` is its session number), ``join/<n>`` (who joined, JSON),
``challenge/<n>``, ``response/<n>`` and ``verdict/<n>`` (the admission of session
``n``, :mod:`tensorxfer.ipc.remote.handshake`) and ``closed`` (set when the learner
closes).

Everything a peer sends is decoded here, by functions that return a checked value
or raise :class:`ProtocolError` (a ``ValueError``), whatever the bytes:
:func:`decode_header`, :meth:`RingInfo.decode`, :meth:`JoinRecord.decode`,
:func:`decode_verdict`.  ``tests/python/ipc/test_remote_protocol.py`` draws
arbitrary messages for each with Hypothesis.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence

# 2: credits are gloo's receive-ready notices (version 1 sent credit messages), bytes before header.
# 3: the learner admits each session (a verdict per join: protocol version, optional shared-secret token).
PROTOCOL_VERSION = 3

TAG_HEADER = 1
TAG_DATA = 2
TAG_CONTROL = 3

KIND_DATA = 1
KIND_HEARTBEAT = 2
KIND_BYE = 3

CONTROL_CLOSE = -1
HEADER_WORDS = 4
_TWO_64 = 2**64
# The most bytes a peer's JSON record may have (a join record, the ring info, a verdict): a name,
# a host, a nonce and a few numbers take a few hundred.
MAX_RECORD_BYTES = 4096


class ProtocolError(ValueError):
    """What a peer sent breaks the remote-ring protocol (the message says how)."""


def check_seconds(value: Any, name: str) -> float:
    """A loss or rendezvous timeout: seconds in (0, 86400); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 86400:
        raise ValueError(f"{name} must be seconds in (0, 86400), got {value!r}")
    return float(value)


def store_prefix(key: str) -> str:
    """The store prefix of one learner's ring (``key`` tells several rings on one store apart)."""
    if not isinstance(key, str) or not key or "/" in key:
        raise ValueError(f"key must be a non-empty str without '/', got {key!r}")
    return f"tensorxfer/remote-ring/{key}/"


def tick_to_wire(tick_id: int) -> int:
    """A tick id in [0, 2**64) as the int64 with the same bits."""
    return tick_id - _TWO_64 if tick_id >= 2**63 else tick_id


def tick_from_wire(word: int) -> int:
    """The inverse of :func:`tick_to_wire`."""
    return word + _TWO_64 if word < 0 else word


@dataclass(frozen=True)
class Header:
    """One decoded header: :data:`KIND_DATA` (with its slot's sequence, tick id and byte count),
    :data:`KIND_HEARTBEAT` or :data:`KIND_BYE` (the other fields zero)."""

    kind: int
    sequence: int = 0
    tick_id: int = 0
    nbytes: int = 0


def decode_header(words: Sequence[Any], expected_sequence: int, slot_nbytes: int) -> Header:
    """The header a producer sent as four int64 words; :class:`ProtocolError` naming what is wrong
    unless it is a heartbeat, a bye, or the data header of slot ``expected_sequence`` with
    1..``slot_nbytes`` bytes and a tick id in [0, 2**64)."""
    if len(words) != HEADER_WORDS or not all(isinstance(word, int) and not isinstance(word, bool) for word in words):
        raise ProtocolError(f"sent a header of {len(words)} words, expected {HEADER_WORDS} integers")
    kind, sequence, tick_word, nbytes = words
    if not all(-2**63 <= word < 2**63 for word in words):
        raise ProtocolError("sent a header word outside int64")
    if kind in (KIND_HEARTBEAT, KIND_BYE):
        return Header(kind)
    if kind != KIND_DATA:
        raise ProtocolError(f"sent a header of unknown kind {kind}")
    if sequence != expected_sequence:
        raise ProtocolError(f"sent slot sequence {sequence}, expected {expected_sequence} "
                            "(its slots must arrive in publish order)")
    if not 1 <= nbytes <= slot_nbytes:
        raise ProtocolError(f"announced {nbytes} bytes for a slot of {slot_nbytes} bytes")
    return Header(kind, sequence, tick_from_wire(tick_word), nbytes)


def _record(raw: Any, what: str) -> Dict[str, Any]:
    """A peer's JSON object, size-checked before parsing; ProtocolError otherwise."""
    if not isinstance(raw, (bytes, bytearray)):
        raise ProtocolError(f"{what} is not bytes")
    if len(raw) > MAX_RECORD_BYTES:
        raise ProtocolError(f"{what} is {len(raw)} bytes, more than the {MAX_RECORD_BYTES} a record may have")
    try:
        fields = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ProtocolError(f"{what} is not JSON ({type(error).__name__})") from None
    if not isinstance(fields, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return fields


def _field(fields: Dict[str, Any], name: str, kind: type, what: str, low: Optional[float] = None,
           high: Optional[float] = None, max_length: int = 256) -> Any:
    value = fields.get(name)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{what}: {name} must be an integer, got {type(value).__name__}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ProtocolError(f"{what}: {name} must be a number, got {type(value).__name__}")
        value = float(value)
    elif not isinstance(value, str) or not value or len(value) > max_length:
        raise ProtocolError(f"{what}: {name} must be a non-empty string of at most {max_length} characters")
    if not isinstance(value, str) and ((low is not None and value < low) or (high is not None and value > high)):
        raise ProtocolError(f"{what}: {name} must be in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class RingInfo:
    """What the learner publishes for producers: the slots they write and how fast it judges them lost."""

    ring: str
    slot_nbytes: int
    credits: int
    timeout: float
    protocol: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "RingInfo":
        """The learner's record; :class:`ProtocolError` when it speaks another version of this protocol
        or is not a ring record."""
        fields = _record(raw, "the learner's ring record")
        version = fields.get("protocol", 1)  # the first version wrote none
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"the learner's ring {str(fields.get('ring'))[:200]!r} speaks remote-ring protocol "
                                f"{str(version)[:20]}, this producer {PROTOCOL_VERSION}: install the same tensorxfer "
                                "on both hosts")
        what = "the learner's ring record"
        return cls(_field(fields, "ring", str, what), _field(fields, "slot_nbytes", int, what, 1, 2**40),
                   _field(fields, "credits", int, what, 1, 1024), _field(fields, "timeout", float, what, 1e-3, 86400))


@dataclass(frozen=True)
class JoinRecord:
    """Who joined as session ``session``: the name errors use, its host and pid, the protocol it
    speaks and its nonce (the handshake's challenge to the learner: a hex string)."""

    session: int
    name: str
    host: str
    pid: int
    protocol: int = PROTOCOL_VERSION
    nonce: str = ""

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "host": self.host, "pid": self.pid, "protocol": self.protocol,
                           "nonce": self.nonce}).encode()

    @classmethod
    def decode(cls, session: int, raw: bytes) -> "JoinRecord":
        """Session ``session``'s record; :class:`ProtocolError` for anything that is not one.  The
        protocol version is only read here: the learner refuses another version by name."""
        what = f"session {session}'s join record"
        fields = _record(raw, what)
        version = fields.get("protocol", 2)  # version 2 wrote none
        if isinstance(version, bool) or not isinstance(version, int):
            raise ProtocolError(f"{what}: protocol must be an integer, got {type(version).__name__}")
        nonce = fields.get("nonce", "")
        if not isinstance(nonce, str) or len(nonce) > 128 or any(c not in "0123456789abcdef" for c in nonce):
            raise ProtocolError(f"{what}: nonce must be at most 128 lowercase hex digits")
        return cls(session, _field(fields, "name", str, what), _field(fields, "host", str, what),
                   _field(fields, "pid", int, what, 0, 2**31 - 1), version, nonce)

    def describe(self) -> str:
        return f"remote producer '{self.name}' (session {self.session}, host {self.host}, pid {self.pid})"


@dataclass(frozen=True)
class Verdict:
    """The learner's answer to a join: admitted or not, why not, and (with a token) its proof."""

    admitted: bool
    reason: str = ""
    proof: str = ""

    def encode(self) -> bytes:
        return json.dumps({"admitted": self.admitted, "reason": self.reason, "proof": self.proof}).encode()


def decode_verdict(raw: bytes) -> Verdict:
    """The learner's verdict; :class:`ProtocolError` for anything that is not one."""
    fields = _record(raw, "the learner's verdict")
    admitted = fields.get("admitted")
    reason, proof = fields.get("reason", ""), fields.get("proof", "")
    if not isinstance(admitted, bool) or not isinstance(reason, str) or not isinstance(proof, str):
        raise ProtocolError("the learner's verdict: admitted must be a bool, reason and proof strings")
    return Verdict(admitted, reason[:1000], proof[:256])
