"""The network engines a persistent plan's streams travel on: gloo (or nccl) through a
torch.distributed process group, and MPI through mpi4py (private).

An engine posts one message at a time (``send`` / ``recv`` of a contiguous byte
buffer, to or from a rank of the service's group, on a tag) and waits for one:

* gloo's point-to-point work cannot be polled (it reports completion only from
  ``wait()``, and a ``wait()`` that times out closes the connection), so its engine is
  *blocking*: each stream of a run waits on its own thread, with the run's deadline;
* MPI requests can be tested, so its engine is *polled*: one thread advances every
  stream (``test``), sleeping a little when nothing moved, and a failed run cancels the
  requests still posted (``abandon``). Only a polled engine has those two.

Failures come back as :class:`LinkLost` (the peer's connection closed or reset: it
died) or :class:`LinkTimeout` (the deadline passed), each naming the peer.
"""

from __future__ import annotations

import ctypes
import datetime
import time
from typing import Any, Optional, Tuple

import numpy as np


class LinkError(Exception):
    """A wait on a message from or to ``peer`` failed."""

    def __init__(self, peer: int, text: str) -> None:
        super().__init__(text)
        self.peer = peer


class LinkLost(LinkError):
    """The peer's connection closed or reset: the peer (or its host) is gone."""


class LinkTimeout(LinkError):
    """The run's deadline passed while waiting on the peer."""


def _link_error(peer: int, error: RuntimeError) -> LinkError:
    """gloo's error on a connection as LinkTimeout (its wait gave up) or LinkLost."""
    text = str(error)
    if "timed out" in text.lower() or "timeout" in text.lower():
        return LinkTimeout(peer, text)
    return LinkLost(peer, text)


def _address_array(address: int, nbytes: int) -> np.ndarray:
    """A uint8 numpy view of nbytes at a host address (no owner: the caller keeps it alive)."""
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


#: gloo tags of persistent plans: plan p (its build index) owns TAG_BLOCK tags from
#: TAG_FIRST + (p % TAG_BLOCKS) * TAG_BLOCK, apart from the copy services' own (small) tags,
#: so a closed plan's receives still posted never take a later plan's messages.
TAG_FIRST, TAG_BLOCK, TAG_BLOCKS = 1 << 28, 1 << 16, 1 << 11


class TorchEngine:
    """Messages on a torch.distributed process group's own send / recv (gloo: host tensors),
    on the tags of one plan (``plan_index``: the same on every rank)."""

    blocking = True
    max_tags = TAG_BLOCK - 1

    def __init__(self, process_group: Any, plan_index: int) -> None:
        import torch

        self._torch = torch
        self._group = process_group
        self._tag_base = TAG_FIRST + (plan_index % TAG_BLOCKS) * TAG_BLOCK

    def buffer(self, address: int, nbytes: int) -> Any:
        return self._torch.from_numpy(_address_array(address, nbytes))

    def staging(self, nbytes: int) -> Tuple[Any, int]:
        tensor = self._torch.empty(max(nbytes, 1), dtype=self._torch.uint8)
        return tensor, tensor.data_ptr()

    def as_numpy(self, buffer: Any) -> np.ndarray:
        return buffer.numpy()

    def send(self, buffer: Any, peer: int, tag: int) -> Any:
        try:
            return self._group.send([buffer], peer, self._tag_base + tag)
        except RuntimeError as error:  # a connection already closed fails the post itself
            raise _link_error(peer, error) from error

    def recv(self, buffer: Any, peer: int, tag: int) -> Any:
        try:
            return self._group.recv([buffer], peer, self._tag_base + tag)
        except RuntimeError as error:
            raise _link_error(peer, error) from error

    def wait(self, request: Any, peer: int, deadline: Optional[float]) -> None:
        try:
            if deadline is None:
                request.wait()
            else:
                request.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError as error:
            raise _link_error(peer, error) from error

    def release(self, peer: int) -> bool:
        """Ends this process's pending operations on the group, at once: a gloo wait cannot
        be cancelled, but one that times out closes every connection of the group (their
        pending operations then fail), which a receive from ``peer`` that nobody sends does.
        Returns False when the connection to ``peer`` was closed already (try another).
        After a failed run only: the group is unusable afterwards. (An operation whose
        message was on the wire when its peer died is not ended by gloo: only its wait's
        deadline ends it.)"""
        dummy = self._torch.zeros(1, dtype=self._torch.uint8)
        try:
            self._group.recv([dummy], peer, self._tag_base + self.max_tags).wait(datetime.timedelta(milliseconds=1))
        except RuntimeError as error:
            return isinstance(_link_error(peer, error), LinkTimeout)
        return True

    def close(self) -> None:
        """Nothing of its own to release (the process group is the caller's)."""


class MpiEngine:
    """Messages on a private duplicate of an mpi4py communicator (Isend / Irecv / Test), one
    per plan (made collectively, freed by close())."""

    blocking = False
    max_tags = 32766

    def __init__(self, MPI: Any, comm: Any) -> None:
        self._MPI = MPI
        self._comm = comm.Dup()
        self.max_tags = min(int(comm.Get_attr(MPI.TAG_UB) or 32767), 1 << 30)

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None and not self._MPI.Is_finalized():
            comm.Free()

    def buffer(self, address: int, nbytes: int) -> Any:
        return _address_array(address, nbytes)

    def staging(self, nbytes: int) -> Tuple[Any, int]:
        array = np.empty(max(nbytes, 1), np.uint8)
        return array, array.ctypes.data

    def as_numpy(self, buffer: Any) -> np.ndarray:
        return buffer

    def send(self, buffer: Any, peer: int, tag: int) -> Any:
        return self._comm.Isend([buffer, buffer.size, self._MPI.BYTE], dest=peer, tag=tag)

    def recv(self, buffer: Any, peer: int, tag: int) -> Any:
        return self._comm.Irecv([buffer, buffer.size, self._MPI.BYTE], source=peer, tag=tag)

    def test(self, request: Any, peer: int) -> bool:
        try:
            return bool(request.Test())
        except self._MPI.Exception as error:
            raise LinkLost(peer, str(error)) from error

    def wait(self, request: Any, peer: int, deadline: Optional[float]) -> None:
        nap = 0.0
        while not self.test(request, peer):
            if deadline is not None and time.monotonic() >= deadline:
                self.abandon(request)
                raise LinkTimeout(peer, "the run's deadline passed")
            nap = min(0.001, nap * 1.5 if nap else 0.00002)
            time.sleep(nap)

    def abandon(self, request: Any) -> None:
        try:
            request.Cancel()
        except self._MPI.Exception:
            pass

    def release(self, peer: int) -> bool:
        """Nothing to do: MPI requests are tested, no thread waits on them."""
        return True
