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
``add(joins, 1)`` is its session number), ``join/<n>`` (who joined, JSON) and
``closed`` (set when the learner closes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# 2: credits are gloo's receive-ready notices (version 1 sent credit messages), bytes before header.
PROTOCOL_VERSION = 2

TAG_HEADER = 1
TAG_DATA = 2
TAG_CONTROL = 3

KIND_DATA = 1
KIND_HEARTBEAT = 2
KIND_BYE = 3

CONTROL_CLOSE = -1
HEADER_WORDS = 4
_TWO_64 = 2**64


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
        """The learner's record; ``ValueError`` when it speaks another version of this protocol."""
        fields: Any = json.loads(raw)
        version = int(fields.get("protocol", 1))  # the first version wrote none
        if version != PROTOCOL_VERSION:
            raise ValueError(f"the learner's ring {fields.get('ring')!r} speaks remote-ring protocol {version}, "
                             f"this producer {PROTOCOL_VERSION}: install the same tensorxfer on both hosts")
        return cls(str(fields["ring"]), int(fields["slot_nbytes"]), int(fields["credits"]), float(fields["timeout"]))


@dataclass(frozen=True)
class JoinRecord:
    """Who joined as session ``session``: the name errors use, its host and pid."""

    session: int
    name: str
    host: str
    pid: int

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "host": self.host, "pid": self.pid}).encode()

    @classmethod
    def decode(cls, session: int, raw: bytes) -> "JoinRecord":
        fields: Any = json.loads(raw)
        return cls(session, str(fields["name"]), str(fields["host"]), int(fields["pid"]))

    def describe(self) -> str:
        return f"remote producer '{self.name}' (session {self.session}, host {self.host}, pid {self.pid})"
