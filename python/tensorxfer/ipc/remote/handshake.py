"""The admission of a remote producer's session: protocol version, and an optional shared secret.

A producer that counted itself in as session ``n`` (``add(joins, 1)``) writes its
:class:`~tensorxfer.ipc.remote.protocol.JoinRecord` to ``join/<n>``.  The learner
then decides, within its ``timeout``, and writes ``verdict/<n>``; only an admitted
session gets a gloo pair, and with it ring slots.  Refused: no record in time, a
record that does not decode, another protocol version, a missing or wrong token,
too many sessions joining at once.

With a token (``token=`` or the ``TENSORXFER_REMOTE_TOKEN`` environment variable,
on both sides) the learner writes a random ``challenge/<n>`` first; the producer
answers ``response/<n>`` = HMAC-SHA256(token, "producer" | context), and the
learner's verdict carries its own proof, HMAC-SHA256(token, "learner" | context),
which the producer checks before it sends a byte.  The context binds both to
this ring, this session, the producer's nonce and the learner's challenge, so no
answer can be replayed for another session.  What this does not protect is in
``SECURITY.md`` beside this module: it authenticates the admission only; it does
not encrypt, and the slots' bytes travel unauthenticated over gloo's TCP.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from typing import Any, Optional, Tuple, Union

from tensorxfer.ipc.remote.protocol import (JoinRecord, PROTOCOL_VERSION, ProtocolError, Verdict,
                                            decode_verdict)

TOKEN_ENVIRONMENT = "TENSORXFER_REMOTE_TOKEN"
MIN_TOKEN_BYTES = 16
_POLL_S = 0.02


def resolve_token(token: Union[str, bytes, None]) -> Optional[bytes]:
    """The shared secret: ``token`` if given, else ``$TENSORXFER_REMOTE_TOKEN`` if set, else None.
    ValueError for one shorter than 16 bytes, TypeError for another type."""
    if token is None:
        token = os.environ.get(TOKEN_ENVIRONMENT) or None
        if token is None:
            return None
    if isinstance(token, str):
        token = token.encode()
    if not isinstance(token, bytes):
        raise TypeError(f"token must be str or bytes, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_BYTES:
        raise ValueError(f"token must have at least {MIN_TOKEN_BYTES} bytes (e.g. python -c 'import secrets; "
                         f"print(secrets.token_hex(32))'), got {len(token)}")
    return token


def _proof(token: bytes, role: str, ring: str, session: int, nonce: str, challenge: str) -> str:
    context = f"tensorxfer-remote-ring/{PROTOCOL_VERSION}|{role}|{ring}|{session}|{nonce}|{challenge}"
    return hmac.new(token, context.encode(), hashlib.sha256).hexdigest()


def wait_for_key(store: Any, key: str, deadline: float, stop: Optional[threading.Event] = None) -> bool:
    """Polls ``store`` for ``key`` until ``deadline`` (time.monotonic); never blocks in the store."""
    while True:
        if store.check([key]):
            return True
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            return False
        time.sleep(_POLL_S)


def _delete(store: Any, *keys: str) -> None:
    for key in keys:
        try:
            store.delete_key(key)
        except Exception:  # noqa: BLE001 - gone already, or the store is going away
            pass


def admit(store: Any, prefix: str, session: int, ring: str, token: Optional[bytes], timeout: float,
          stop: threading.Event) -> Tuple[Optional[JoinRecord], str]:
    """The learner's side for session ``session``: ``(record, "")`` when admitted, ``(record or None,
    reason)`` when refused.  Writes the verdict either way; takes at most ``2 * timeout``."""
    keys = {name: f"{prefix}{name}/{session}" for name in ("join", "challenge", "response", "verdict")}
    record: Optional[JoinRecord] = None
    challenge = ""
    try:
        if not wait_for_key(store, keys["join"], time.monotonic() + timeout, stop):
            return _refuse(store, keys, None, f"sent no join record within {timeout:g} s")
        try:
            record = JoinRecord.decode(session, store.get(keys["join"]))
        except ProtocolError as error:
            return _refuse(store, keys, None, str(error))
        if record.protocol != PROTOCOL_VERSION:
            return _refuse(store, keys, record, f"speaks remote-ring protocol {record.protocol}, this learner "
                                                f"{PROTOCOL_VERSION}: install the same tensorxfer on both hosts")
        if token is None:
            store.set(keys["verdict"], Verdict(True).encode())
            return record, ""
        challenge = secrets.token_hex(32)
        store.set(keys["challenge"], challenge.encode())
        if not wait_for_key(store, keys["response"], time.monotonic() + timeout, stop):
            return _refuse(store, keys, record, f"answered no token challenge within {timeout:g} s "
                                                "(a producer without the token?)")
        response = store.get(keys["response"])
        expected = _proof(token, "producer", ring, session, record.nonce, challenge)
        if not isinstance(response, bytes) or not hmac.compare_digest(response, expected.encode()):
            return _refuse(store, keys, record, "answered the token challenge wrongly (another token, or none)")
        proof = _proof(token, "learner", ring, session, record.nonce, challenge)
        store.set(keys["verdict"], Verdict(True, proof=proof).encode())
        return record, ""
    finally:
        _delete(store, keys["join"], keys["challenge"], keys["response"])


def _refuse(store: Any, keys: dict, record: Optional[JoinRecord], reason: str) -> Tuple[Optional[JoinRecord], str]:
    try:
        store.set(keys["verdict"], Verdict(False, reason=reason).encode())
    except Exception:  # noqa: BLE001 - the store is going away: the producer times out instead
        pass
    return record, reason


def refuse(store: Any, prefix: str, session: int, reason: str) -> None:
    """Refuses session ``session`` without looking at it (the learner is too busy to)."""
    _refuse(store, {"verdict": f"{prefix}verdict/{session}"}, None, reason)


def forget_verdict(store: Any, prefix: str, session: int) -> None:
    """Removes session ``session``'s verdict (once its producer has had time to read it)."""
    _delete(store, f"{prefix}verdict/{session}")


def join(store: Any, prefix: str, record: JoinRecord, ring: str, token: Optional[bytes], address: str,
         deadline: float) -> None:
    """The producer's side: writes ``record`` and waits for the verdict; answers the learner's
    challenge with ``token`` and checks its proof.  PermissionError when refused or when the learner
    cannot prove it knows the token; TimeoutError when no verdict comes by ``deadline``."""
    session = record.session
    keys = {name: f"{prefix}{name}/{session}" for name in ("join", "challenge", "response", "verdict")}
    store.set(keys["join"], record.encode())
    answered = ""
    while True:
        if store.check([keys["verdict"]]):
            break
        if not answered and store.check([keys["challenge"]]):
            challenge = store.get(keys["challenge"])
            if token is None:
                raise PermissionError(f"the learner at {address} admits only producers with its token: pass "
                                      f"token= or set {TOKEN_ENVIRONMENT}")
            answered = challenge.decode("ascii", "replace")[:128]
            store.set(keys["response"], _proof(token, "producer", ring, session, record.nonce, answered).encode())
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the learner at {address} did not admit session {session} in time")
        time.sleep(_POLL_S)
    try:
        verdict = decode_verdict(store.get(keys["verdict"]))
    except ProtocolError as error:
        raise PermissionError(f"the learner at {address} answered with no verdict: {error}") from None
    if not verdict.admitted:
        raise PermissionError(f"the learner at {address} refused this producer: {verdict.reason}")
    if token is not None:
        expected = _proof(token, "learner", ring, session, record.nonce, answered) if answered else ""
        if not answered or not hmac.compare_digest(verdict.proof.encode(), expected.encode()):
            raise PermissionError(f"the learner at {address} did not prove it holds the token (it asked for none, "
                                  "or answered wrongly): refusing to send it anything")
