"""Writes the hand-made regression inputs of tests/fuzz/regressions/ (their README.md says what each
one is). Each is encoded as the target's FuzzInput reads it (tests/fuzz/fuzz_support.h):
little-endian fixed-width values in order; take_in(low, high) takes the full width and keeps
``low + raw % (high - low + 1)``.

    python3 tests/fuzz/craft_inputs.py    # rewrites the files; their bytes must not change
"""

from __future__ import annotations

import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent


def u8(value: int) -> bytes:
    return struct.pack("<B", value)


def u16(value: int) -> bytes:
    return struct.pack("<H", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value % 2**64)


def int_in(value: int, low: int, width: int = 4) -> bytes:
    """take_in<int or size_t>(low, high) returning ``value`` (raw = value - low; high irrelevant when raw is small)."""
    return (value - low).to_bytes(width, "little")


# ---- schedule_fuzz: mode, world_size, limits, count, then (step, size, src, dest) per task --------


def schedule_input(mode: int, world_size: int, slot: int, max_tasks: int, tasks: list) -> bytes:
    """``slot``: bytes of a slot, given as a raw u64 (limits tag 0x80); ``max_tasks`` < 256."""
    data = u8(mode) + int_in(world_size, -1) + u8(0x80) + u64(slot) + u8(max_tasks) + int_in(len(tasks), 0, 8)
    task_id = 0
    for next_id, nbytes, src, dest in tasks:
        assert 0 < next_id - task_id < 0xFF
        data += u8(next_id - task_id) + u8(0xC0) + u64(nbytes) + u8(src + 1) + u8(dest + 1)
        task_id = next_id
    return data


SCHEDULE = {
    # A rank declares 2^40 bytes for a task and the slots hold 64: 2^34 segments. Before the fix
    # segment_tasks allocated them one by one (past the fuzzer's memory limit); now InvalidArgument.
    "task-of-2pow40-bytes-in-64-byte-slots": schedule_input(1, 2, 64, 8, [(1, 2**40, 0, 1)]),
    # A task of 2^64 - 1 bytes in slots of 2^63: the segment offset wrapped to 0 and segment_tasks
    # never ended. Now two segments.
    "segment-offset-wraps": schedule_input(1, 2, 2**63, 8, [(1, 2**64 - 1, 0, 1)]),
    # Two segments of 2^63 bytes for one pair: the packer's sort negated (int64) 2^63, signed overflow
    # (UBSan). Now compared unsigned.
    "two-segments-of-2pow63-bytes": schedule_input(1, 2, 2**63, 8, [(1, 2**63, 0, 1), (2, 2**63, 0, 1)]),
    # One pair, 16384 one-segment batches: placing batch k scanned iterations 0..k (n^2 / 2 steps,
    # past the 1 s limit under the sanitizers). Now the scan starts at the ranks' first free iteration.
    "one-pair-16384-batches": schedule_input(1, 2, 64, 1, [(1, 64 * 16384, 0, 1)]),
}


# ---- signal_layout_fuzz, descriptor mode: mode, call, two descriptor changes, epoch, lost-rank word ----


def lost_rank_input(word: int) -> bytes:
    """Rank 1 has not arrived (epoch 0) and its lost-rank word says ``word``; rank 0 runs a barrier."""
    return u8(1) + u8(0x02) + u8(0) + u8(0) + u8(0) + struct.pack("<I", word)


SIGNAL_LAYOUT = {
    # A peer's lost-rank word naming rank 2 of a 2-rank group: rank 0 passed "rank 2 was lost" on
    # to its own peers. Now CorruptSegment.
    "lost-rank-word-names-no-rank": lost_rank_input(3),
}


def main() -> None:
    for name, data in SCHEDULE.items():
        (HERE / "regressions" / "schedule_fuzz" / name).write_bytes(data)
    (HERE / "regressions" / "signal_layout_fuzz").mkdir(exist_ok=True)
    for name, data in SIGNAL_LAYOUT.items():
        (HERE / "regressions" / "signal_layout_fuzz" / name).write_bytes(data)


if __name__ == "__main__":
    main()
