"""The resharding demo's synthetic model, its two layouts, the move plan and the verification.

Everything here is a pure function of the options, so every rank computes the
same model, the same task list and the same task ids without talking to the
others.

- ``build_model``: a transformer-like list of a few hundred tensors of mixed
  shapes and dtypes whose sizes add up to about the requested total.
- Layouts: the *source* layout splits every tensor ``source_parts`` ways (one
  part per rank), the *target* layout ``target_parts`` ways (parts on ranks
  ``0 .. target_parts-1``; the other ranks hold nothing there but still send).
  Matrices go from a split along the output dimension (rows) to a split along
  the input dimension (columns); the embedding tables the other way round;
  vectors stay split along their only dimension.
- ``plan_tasks``: one task per (tensor, source part, target part) overlap, with
  the strided slices of the source shard and of the target shard it covers.
  A row-split source gives a strided source slice and a contiguous destination
  slice; the embedding tables give a non-contiguous destination, which the copy
  services stage as documented.
- Values: element ``i`` (C order) of tensor ``t`` is a hash of ``(seed, t, i)``
  reinterpreted as the tensor's dtype. A source shard is generated from its
  region's index grid; the verification generates the *full* tensor from
  ``arange`` and cuts the target shard out of it with numpy slicing, an
  independent path to the same bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

Region = Tuple[Tuple[int, int], ...]  # (start, stop) per dimension

LAYERS = 24
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One weight: name, shape, dtype and the dimension each layout splits."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    source_dim: int
    target_dim: int

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Task:
    """One overlap of a source shard and a target shard: a send and a receive that share ``task_id``."""

    task_id: int
    tensor: int  # index into the model
    src_rank: int
    dst_rank: int
    src_slices: Tuple[slice, ...]  # into the source shard
    dst_slices: Tuple[slice, ...]  # into the target shard
    nbytes: int


def _layer_tensors(layer: int, hidden: int) -> List[TensorSpec]:
    prefix = f"layers.{layer}."
    ffn = 4 * hidden
    matrix = [("attn.q.weight", (hidden, hidden), "float16"), ("attn.k.weight", (hidden, hidden), "float16"),
              ("attn.v.weight", (hidden, hidden), "float16"), ("attn.o.weight", (hidden, hidden), "float32"),
              ("mlp.up.weight", (ffn, hidden), "int8"), ("mlp.down.weight", (hidden, ffn), "float16")]
    vector = [("attn.norm.weight", (hidden,), "float32"), ("mlp.norm.weight", (hidden,), "float32"),
              ("mlp.up.scale", (ffn,), "float64"), ("attn.o.bias", (hidden,), "int32")]
    return ([TensorSpec(prefix + name, shape, dtype, 0, 1) for name, shape, dtype in matrix]
            + [TensorSpec(prefix + name, shape, dtype, 0, 0) for name, shape, dtype in vector])


def _model_for(hidden: int) -> List[TensorSpec]:
    vocab = 8 * hidden
    tensors = [TensorSpec("embed.weight", (vocab, hidden), "float32", 1, 0)]
    for layer in range(LAYERS):
        tensors.extend(_layer_tensors(layer, hidden))
    tensors.append(TensorSpec("final_norm.weight", (hidden,), "float32", 0, 0))
    tensors.append(TensorSpec("lm_head.weight", (vocab, hidden), "float16", 1, 0))
    return tensors


def build_model(total_mib: float) -> List[TensorSpec]:
    """A model of ``4 + 10 * LAYERS`` tensors of about ``total_mib`` MiB (at least a few KiB).

    The hidden size is the largest multiple of 8 whose model fits the total
    (8 at the least), so shapes split unevenly across most rank counts too.
    """
    if not total_mib > 0:
        raise ValueError(f"total_mib: expected > 0, got {total_mib!r}")
    target = total_mib * _MIB
    hidden = 8
    while sum(t.nbytes for t in _model_for(hidden + 8)) <= target:
        hidden += 8
    return _model_for(hidden)


def split_bounds(length: int, parts: int) -> List[Tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(length)``, sizes differing by at most one."""
    return [(part * length // parts, (part + 1) * length // parts) for part in range(parts)]


def shard_region(spec: TensorSpec, dim: int, parts: int, part: int) -> Region:
    """The region of ``spec`` that part ``part`` of a ``parts``-way split along ``dim`` holds."""
    bounds = split_bounds(spec.shape[dim], parts)[part]
    return tuple(bounds if d == dim else (0, size) for d, size in enumerate(spec.shape))


def region_shape(region: Region) -> Tuple[int, ...]:
    """The shape of a region."""
    return tuple(stop - start for start, stop in region)


def _local_slices(region: Region, within: Region) -> Tuple[slice, ...]:
    return tuple(slice(start - base, stop - base) for (start, stop), (base, _) in zip(region, within))


def plan_tasks(model: Sequence[TensorSpec], source_parts: int, target_parts: int) -> List[Task]:
    """Every non-empty (tensor, source part, target part) overlap, numbered in that order.

    Source part ``p`` lives on rank ``p``, target part ``q`` on rank ``q``.
    """
    tasks: List[Task] = []
    for index, spec in enumerate(model):
        itemsize = np.dtype(spec.dtype).itemsize
        for src in range(source_parts):
            src_region = shard_region(spec, spec.source_dim, source_parts, src)
            for dst in range(target_parts):
                dst_region = shard_region(spec, spec.target_dim, target_parts, dst)
                overlap = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(src_region, dst_region))
                count = int(np.prod([max(stop - start, 0) for start, stop in overlap], dtype=np.int64))
                if count == 0:
                    continue
                tasks.append(Task(len(tasks), index, src, dst, _local_slices(overlap, src_region),
                                  _local_slices(overlap, dst_region), count * itemsize))
    return tasks


# ---- values ------------------------------------------------------------------------------

_GOLDEN = np.uint32(0x9E3779B1)


def _tensor_key(seed: int, tensor: int) -> np.uint32:
    mixed = _fmix32(np.array([(seed * 1_000_003 + tensor) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64).astype(np.uint32))
    return np.uint32(mixed[0])


def _fmix32(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, in place on a uint32 array (wrapping arithmetic)."""
    values ^= values >> np.uint32(16)
    values *= np.uint32(0x85EBCA6B)
    values ^= values >> np.uint32(13)
    values *= np.uint32(0xC2B2AE35)
    values ^= values >> np.uint32(16)
    return values


def _values_from_flat(flat: np.ndarray, key: np.uint32, dtype: np.dtype) -> np.ndarray:
    """The values at C-order element indices ``flat`` (uint32 array of any shape)."""
    if dtype.itemsize == 8:
        low = _values_from_flat(flat * np.uint32(2), key, np.dtype(np.uint32))
        high = _values_from_flat(flat * np.uint32(2) + np.uint32(1), key, np.dtype(np.uint32))
        return np.stack([low, high], axis=-1).view(np.uint64)[..., 0].view(dtype)
    hashed = _fmix32(flat * _GOLDEN + key)
    return hashed.astype(np.dtype(f"u{dtype.itemsize}"), copy=False).view(dtype)


def generate_region(spec: TensorSpec, tensor: int, seed: int, region: Region) -> np.ndarray:
    """A new C-contiguous array with the values of ``region`` of tensor ``tensor`` (the source side)."""
    strides = [int(np.prod(spec.shape[d + 1:], dtype=np.int64)) for d in range(len(spec.shape))]
    flat = np.zeros(region_shape(region), np.uint32)
    for dim, ((start, stop), stride) in enumerate(zip(region, strides)):
        axis = np.arange(start, stop, dtype=np.uint32) * np.uint32(stride)
        flat += axis.reshape([-1 if d == dim else 1 for d in range(len(region))])
    return np.ascontiguousarray(_values_from_flat(flat, _tensor_key(seed, tensor), np.dtype(spec.dtype)))


def generate_full(spec: TensorSpec, tensor: int, seed: int) -> np.ndarray:
    """The whole tensor, from the flat element index (the verification side)."""
    count = int(np.prod(spec.shape, dtype=np.int64))
    flat = np.arange(count, dtype=np.uint32).reshape(spec.shape)
    return _values_from_flat(flat, _tensor_key(seed, tensor), np.dtype(spec.dtype))


def expected_target_shards(model: Sequence[TensorSpec], seed: int, target_parts: int,
                           part: int) -> Dict[int, np.ndarray]:
    """Target part ``part`` of every tensor, cut out of the full tensors with numpy slicing."""
    expected = {}
    for index, spec in enumerate(model):
        full = generate_full(spec, index, seed)
        start, stop = split_bounds(spec.shape[spec.target_dim], target_parts)[part]
        cut = [slice(None)] * len(spec.shape)
        cut[spec.target_dim] = slice(start, stop)
        expected[index] = np.ascontiguousarray(full[tuple(cut)])
    return expected


class ShardMismatch(AssertionError):
    """A received target shard differs from the independent recomputation (names the tensor)."""


def first_mismatch(spec: TensorSpec, part: int, target_parts: int, got: np.ndarray,
                   expected: np.ndarray) -> Optional[str]:
    """None when ``got`` equals ``expected`` byte for byte, else a message naming the tensor and element."""
    if got.shape == expected.shape and np.array_equal(got.reshape(-1).view(np.uint8),
                                                      expected.reshape(-1).view(np.uint8)):
        return None
    if got.shape != expected.shape:
        return f"tensor {spec.name!r} target part {part}: shape {got.shape}, expected {expected.shape}"
    width = got.dtype.itemsize
    differs = got.reshape(-1).view(f"u{width}") != expected.reshape(-1).view(f"u{width}")
    local = np.unravel_index(int(np.argmax(differs)), got.shape)
    start = split_bounds(spec.shape[spec.target_dim], target_parts)[part][0]
    global_index = tuple(int(i) + (start if d == spec.target_dim else 0) for d, i in enumerate(local))
    return (f"tensor {spec.name!r} (shape {spec.shape}, {spec.dtype}) target part {part}: "
            f"{int(differs.sum())} of {differs.size} elements differ, first at index {global_index}: "
            f"got {got[local]!r}, expected {expected[local]!r}")


__all__ = ["TensorSpec", "Task", "ShardMismatch", "build_model", "split_bounds", "shard_region", "plan_tasks",
           "generate_region", "generate_full", "expected_target_shards", "first_mismatch", "LAYERS"]
