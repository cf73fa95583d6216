"""What a remote producer and the learner's relay say to each other, and where they meet.

Each producer session is a two-rank gloo group (the learner rank 0, the producer
rank 1) made on the rendezvous store under ``<prefix>session/<n>/``; nothing else
travels outside torch.distributed point-to-point messages:

* learner -> producer, tag :data:`TAG_CREDIT`: one int64, ``n > 0`` grants ``n``
  more slots (each is a ring slot the learner holds for that producer, with a
  receive already posted into it), :data:`CREDIT_CLOSE` means the learner closes.
* producer -> learner, tag :data:`TAG_HEADER`: four int64, ``(kind, sequence,
  tick_id, nbytes)``; a :data:`KIND_DATA` header is followed by ``nbytes`` bytes on
  tag :data:`TAG_DATA`, which land in the oldest slot granted and not yet filled.
  :data:`KIND_HEARTBEAT` says "alive, nothing to send"; :data:`KIND_BYE` "closing".

The store keys, under ``tensorxfer/remote-ring/<key>/``: ``info`` (the ring's
shape and the learner's timeout, JSON), ``joins`` (a counter: a producer's
``add(joins, 1)`` is its session number), ``join/<n>`` (who joined, JSON) and
``closed`` (set when the learner closes).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

TAG_HEADER = 1
TAG_DATA = 2
TAG_CREDIT = 3

KIND_DATA = 1
KIND_HEARTBEAT = 2
KIND_BYE = 3

CREDIT_CLOSE = -1
HEADER_WORDS = 4
_TWO_64 = 2**64


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

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "RingInfo":
        fields: Any = json.loads(raw)
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
