"""The rendezvous of a learner and its remote producers: torch's own store, named as torch names it.

``init_method`` is what ``torch.distributed.init_process_group`` takes:

* ``"tcp://HOST:PORT"``: the learner serves a ``TCPStore`` on PORT (``0``: any
  free port; :attr:`tensorxfer.ipc.remote.RemoteProducers.init_method` then names the one it got);
  producers connect to HOST:PORT.
* ``"env://"`` or ``None``: the same from ``MASTER_ADDR`` and ``MASTER_PORT``,
  the variables ``torchrun`` sets.  Under ``torchrun`` (where
  ``TORCHELASTIC_USE_AGENT_STORE=True``) the agent already serves that store, so
  the learner connects to it like everyone else.

Anyone who reaches that port reaches the store: the learner admits each producer
session itself (:mod:`tensorxfer.ipc.remote.handshake`; with a shared-secret
token, an HMAC challenge-response), but nothing here encrypts, and the store has
no authentication of its own.  ``SECURITY.md`` beside this file says what is and
is not protected.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Optional, Tuple
from urllib.parse import urlparse


def parse_init_method(init_method: Optional[str]) -> Tuple[str, int]:
    """``(host, port)`` from ``init_method`` (see the module docstring); ValueError naming what is wrong."""
    if init_method is None or init_method == "env://":
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if missing:
            raise ValueError(f"init_method {init_method!r} reads MASTER_ADDR and MASTER_PORT (as torchrun sets "
                             f"them), but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set")
        host, port_text = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    elif isinstance(init_method, str) and init_method.startswith("tcp://"):
        parsed = urlparse(init_method)
        try:
            port_number = parsed.port
        except ValueError as error:  # out of range, or not a number
            raise ValueError(f"init_method {init_method!r}: the port {error}") from None
        if not parsed.hostname or port_number is None:
            raise ValueError(f"init_method must be 'tcp://HOST:PORT', got {init_method!r}")
        host, port_text = parsed.hostname, str(port_number)
    else:
        raise ValueError(f"init_method must be 'tcp://HOST:PORT', 'env://' or None (MASTER_ADDR/MASTER_PORT), "
                         f"got {init_method!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"the rendezvous port must be an integer, got {port_text!r}") from None
    if not 0 <= port < 65536:
        raise ValueError(f"the rendezvous port must be in [0, 65536), got {port}")
    return host, port


def open_store(init_method: Optional[str], *, serve: bool, timeout: float) -> Tuple[Any, str]:
    """The rendezvous store and the ``tcp://`` address producers reach it at.

    ``serve``: this is the learner, which hosts the store unless torchrun's agent does.
    """
    import torch.distributed as dist

    host, port = parse_init_method(init_method)
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and init_method in (None, "env://")
    is_master = serve and not agent_serves
    if not is_master and port == 0:
        raise ValueError("a producer needs the learner's real port; port 0 is only for the learner")
    store = dist.TCPStore(host, port, is_master=is_master, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    return store, f"tcp://{host}:{store.port}"
