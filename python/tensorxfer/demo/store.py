"""The demo's replay store and the batch format shared by collectors and learner.

The store is one ``SharedArray`` per field, filled once from a seeded generator.
A batch is identified by its sample tick: its row indices come from a generator
seeded with ``(base seed, tick)``, so the learner recomputes them independently
of what a collector wrote.  A host slot holds a 64-byte header, then the packed
fields at ``PAYLOAD_OFFSET`` in the ``PackLayout`` of :func:`batch_layout`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Tuple

import numpy as np

if TYPE_CHECKING:
    from tensorxfer.ipc import PackLayout

# Header words (int64) at the start of every host slot.
HEADER_TICK, HEADER_COLLECTOR, HEADER_PUBLISH_NS, HEADER_ROWS, HEADER_MAGIC = range(5)
HEADER_MAGIC_VALUE = 0x7458_6665_7244_656D  # "txferDem"
PAYLOAD_OFFSET = 64
ACTION_DIM = 8


def field_spec(obs_dim: int) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """The replay fields: ``{name: (dtype name, row shape)}``."""
    return {
        "obs": ("float32", (obs_dim,)),
        "action": ("float32", (ACTION_DIM,)),
        "reward": ("float32", ()),
        "done": ("uint8", ()),
    }


def batch_layout(obs_dim: int, batch_rows: int) -> PackLayout:
    """The ``PackLayout`` of one batch."""
    from tensorxfer.ipc import PackLayout

    return PackLayout(field_spec(obs_dim), rows=batch_rows)


def batch_indices(base_seed: int, tick: int, batch_rows: int, store_rows: int) -> np.ndarray:
    """The store rows of the batch with sample tick ``tick`` (int64, deterministic)."""
    generator = np.random.default_rng([int(base_seed), int(tick)])
    return generator.integers(0, store_rows, size=batch_rows, dtype=np.int64)


def collector_tick(collector_id: int, num_collectors: int, sequence: int) -> int:
    """Sample tick of a collector's ``sequence``-th batch: collectors interleave, never collide."""
    return collector_id + num_collectors * sequence


class ReplayStore:
    """The replay fields in shared memory; the creating process owns (and unlinks) them."""

    def __init__(self, arrays: Mapping[str, Any]) -> None:
        """Wraps already created or attached ``SharedArray`` objects, one per field."""
        self._shared = dict(arrays)

    @classmethod
    def create(cls, store_rows: int, obs_dim: int, seed: int) -> "ReplayStore":
        """Creates every field with ``store_rows`` rows and fills it from ``seed``."""
        from tensorxfer.ipc import SharedArray

        store = cls({})
        try:
            for name, (dtype, row_shape) in field_spec(obs_dim).items():
                store._shared[name] = SharedArray.create((store_rows, *row_shape), dtype)
            generator = np.random.default_rng(int(seed))
            arrays = store.arrays
            arrays["obs"][...] = generator.standard_normal(arrays["obs"].shape, dtype=np.float32)
            arrays["action"][...] = generator.uniform(-1, 1, arrays["action"].shape).astype(np.float32)
            arrays["reward"][...] = generator.standard_normal(store_rows, dtype=np.float32)
            arrays["done"][...] = generator.random(store_rows) < 0.01
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def attach(cls, handles: Mapping[str, Any]) -> "ReplayStore":
        """Attaches to a store created in another process from its :attr:`handles`."""
        from tensorxfer.ipc import SharedArray

        store = cls({})
        try:
            for name, handle in handles.items():
                store._shared[name] = SharedArray.attach(handle)
        except BaseException:
            store.close()
            raise
        return store

    @property
    def handles(self) -> Dict[str, Any]:
        """Picklable handles, one per field, for :meth:`attach`."""
        return {name: shared.handle for name, shared in self._shared.items()}

    @property
    def arrays(self) -> Dict[str, np.ndarray]:
        """Zero-copy numpy views of the fields (invalid after :meth:`close`)."""
        return {name: shared.array for name, shared in self._shared.items()}

    @property
    def rows(self) -> int:
        """Rows in every field."""
        return int(next(iter(self._shared.values())).array.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of all fields together."""
        return sum(int(shared.array.nbytes) for shared in self._shared.values())

    def close(self) -> None:
        """Detaches every field (the owner's close unlinks them); idempotent."""
        shared, self._shared = self._shared, {}
        for array in shared.values():
            array.close()

    def __enter__(self) -> "ReplayStore":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class BatchMismatch(AssertionError):
    """A batch that reached the learner differs from the store rows it should hold."""


def verify_batch(fields: Mapping[str, Any], store_arrays: Mapping[str, np.ndarray],
                 indices: np.ndarray, tick: int) -> None:
    """Checks every field of a received batch against ``store[indices]``; raises BatchMismatch."""
    for name, store_array in store_arrays.items():
        if name not in fields:
            raise BatchMismatch(f"batch of tick {tick}: field {name!r} is missing")
        got = np.asarray(fields[name])
        expected = store_array[indices]
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise BatchMismatch(f"batch of tick {tick}: field {name!r} has {got.dtype}{list(got.shape)}, "
                                f"expected {expected.dtype}{list(expected.shape)}")
        if not np.array_equal(got, expected):
            differ = np.nonzero((got != expected).reshape(len(indices), -1).any(axis=1))[0]
            row = int(differ[0])
            raise BatchMismatch(
                f"batch of tick {tick}: field {name!r} differs from the store in {len(differ)} of "
                f"{len(indices)} rows; first at batch row {row} (store row {int(indices[row])})")
