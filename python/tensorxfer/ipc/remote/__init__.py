"""Remote producers of a learner's :class:`~tensorxfer.ipc.SlotRing`, over torch.distributed (gloo).

Collectors on other hosts feed the learner's ring with the calls of a local producer::

    # learner (consumes the ring as before; local producers may attach as well)
    ring = SlotRing.create(depth=8, slot_nbytes=N)
    remote = RemoteProducers.serve(ring, init_method="tcp://0.0.0.0:29600", credits=2, timeout=30.0)
    slot, tick_id = ring.acquire_ready(timeout=5.0)     # local and remote slots alike
    ...
    remote.close(); ring.close()

    # a collector on another host
    producer = RemoteSlotRing.connect("tcp://learner-host:29600", name="collector-3")
    slot = producer.acquire_free(timeout=5.0)           # waits for a credit: the learner's back-pressure
    producer.slot_array(slot)[:] = batch
    producer.publish(slot, tick_id=7)
    producer.close()

Guarantees:

* Credits: a producer has at most ``credits`` slots in flight, and their bytes leave
  only into ring slots the learner holds for it (gloo sends into posted receives
  only), so the learner's ring depth bounds the memory, and a slow learner slows
  its producers.
* Whole slots: a slot is published in the ring only after all its bytes arrived;
  each producer's slots are published in its order.
* Loss: a producer whose process or link dies, or that stays silent for
  ``timeout`` seconds (producers send heartbeats), is reported by the learner's
  next ``acquire_ready`` as ``tensorxfer.PeerLostError`` naming it; its unfinished
  slots go back to the ring.  The learner and the other producers go on, and a
  restarted producer connects again as a new session.
* The learner closing: producers' calls raise ``PeerLostError``.  Producers keep
  no shared memory; the learner's ring removes its own at ``close``.

The transport is torch.distributed point-to-point over gloo (TCP between hosts):
one two-rank group per producer session, made on the rendezvous store
(``tensorxfer.ipc.remote.rendezvous``), so a restarted producer never needs
the old group.

Who may join (``SECURITY.md`` beside this file says it in full):

* Every session is admitted before it gets a gloo pair or a ring slot: a join
  record that decodes, this protocol version, within ``timeout``
  (``tensorxfer.ipc.remote.handshake``).  Whatever else reaches the port
  (nothing, random bytes, one byte a second, huge sizes) is refused and logged
  (logger ``tensorxfer.ipc.remote``), and the other producers go on.
* With a shared secret (``token=`` on both sides, or ``TENSORXFER_REMOTE_TOKEN``
  in both environments) only producers that answer an HMAC-SHA256 challenge are
  admitted, and the learner proves it holds the secret too.
* Nothing is encrypted: slots travel in clear over TCP, and torch's store itself
  accepts anyone who reaches its port.  Keep the port on a private network.
"""

from tensorxfer.ipc.remote.learner import ProducerStats, RemoteProducers
from tensorxfer.ipc.remote.producer import RemoteSlotRing

__all__ = ["ProducerStats", "RemoteProducers", "RemoteSlotRing"]
