"""The half-precision reduction kernels: every vector set this CPU runs (AVX2, AVX-512) gives
bitwise the results of the portable loops, for any length, offset and values (NaN, inf,
subnormals, rounding ties); the portable loops round like numpy (float16) and keep one
canonical NaN."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorxfer import _core

VECTOR_SETS = [name for name in _core.half_kernel_sets() if name != "portable"]
OPS = ["sum", "avg", "max", "min"]
# Bit patterns that stress conversion and rounding, per type: zeros, ones, inf, NaNs (quiet,
# signalling, negative), the smallest/largest subnormals and normals, the largest finite,
# and pairs whose sums land exactly halfway between two representable values.
SPECIAL = {
    "bfloat16": [0x0000, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x007F, 0x8001,
                 0x0080, 0x7F7F, 0xFF7F, 0x3B80, 0x3C00, 0x4000, 0x3F81, 0x3B00],
    "float16": [0x0000, 0x8000, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01, 0x0001, 0x03FF, 0x8001,
                0x0400, 0x7BFF, 0xFBFF, 0x1000, 0x1400, 0x3C01, 0x0C00, 0x0800],
}


def half_words(dtype: str) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(SPECIAL[dtype]), st.integers(0, 0xFFFF))


def word_array(draw, word_type, specials, length: int) -> np.ndarray:
    """``length`` words, each with even odds one of ``specials`` or any bit pattern. Drawn as two
    byte strings (the patterns, and a choice byte per word: below 128 picks a special), which
    Hypothesis generates and shrinks far faster than a list of integers (the suite spent 30 s
    drawing lists); shrinking goes towards every word being the first special."""
    itemsize = np.dtype(word_type).itemsize
    words = np.frombuffer(draw(st.binary(min_size=length * itemsize, max_size=length * itemsize)),
                          word_type).copy()
    choice = np.frombuffer(draw(st.binary(min_size=length, max_size=length)), np.uint8)
    special = choice < 128
    words[special] = np.asarray(specials, word_type)[choice[special] % len(specials)]
    return words


@st.composite
def reductions(draw):
    dtype = draw(st.sampled_from(["bfloat16", "float16"]))
    sources = draw(st.integers(1, 4))
    length = draw(st.integers(0, 200))
    offset = draw(st.integers(0, 17))  # elements before the data: unaligned loads and stores
    values = [word_array(draw, np.uint16, SPECIAL[dtype], length) for _ in range(sources)]
    placed = []
    for value in values:
        backing = np.zeros(offset + length, np.uint16)
        backing[offset:] = value
        placed.append(backing[offset:])
    return dtype, draw(st.sampled_from(OPS)), placed, offset


@pytest.mark.skipif(not VECTOR_SETS, reason="this CPU runs no vector kernel set (needs AVX2+F16C or AVX-512F)")
@pytest.mark.parametrize("kernels", VECTOR_SETS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=reductions())
def test_vector_kernels_match_portable_bitwise(kernels, case):
    dtype, op, sources, offset = case
    expected = np.empty(offset + len(sources[0]), np.uint16)[offset:]
    got = np.empty(offset + len(sources[0]), np.uint16)[offset:]
    _core.reduce_elements(dtype, op, sources, expected, len(sources), "portable")
    _core.reduce_elements(dtype, op, sources, got, len(sources), kernels)
    assert got.tobytes() == expected.tobytes(), (np.flatnonzero(got != expected)[:8], kernels)


@pytest.mark.parametrize("kernels", ["portable", *VECTOR_SETS])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_half_value_round_trips_and_nan_is_canonical(kernels, dtype):
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty_like(words)
    _core.reduce_elements(dtype, "sum", [words], out, 1, kernels)
    exponent_mask, canonical = (0x7F80, 0x7FC0) if dtype == "bfloat16" else (0x7C00, 0x7E00)
    nan = ((words & exponent_mask) == exponent_mask) & ((words & ~np.uint16(exponent_mask | 0x8000)) != 0)
    assert (out[~nan] == words[~nan]).all()
    assert (out[nan] == canonical).all()


@settings(max_examples=200, deadline=None)
@given(a=st.lists(half_words("float16"), min_size=1, max_size=64), data=st.data())
def test_float16_sum_rounds_like_numpy(a, data):
    b = data.draw(st.lists(half_words("float16"), min_size=len(a), max_size=len(a)))
    x, y = np.array(a, np.uint16), np.array(b, np.uint16)
    out = np.empty_like(x)
    _core.reduce_elements("float16", "sum", [x, y], out, 2)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = (x.view(np.float16).astype(np.float32) + y.view(np.float16).astype(np.float32)).astype(np.float16)
    nan = np.isnan(exact)
    assert (out[~nan] == exact.view(np.uint16)[~nan]).all()
    assert (out[nan] == 0x7E00).all()


def test_ties_round_to_even():
    # bfloat16 1.0 + 2**-8 lies halfway between 1.0 and 1 + 2**-7: to even (down);
    # (1 + 2**-7) + 2**-8 lies halfway between two odd/even neighbours: up to 1 + 2**-6.
    half_ulp = np.full(40, 0x3B80, np.uint16)
    for kernels in ["portable", *VECTOR_SETS]:
        result = np.empty(40, np.uint16)
        _core.reduce_elements("bfloat16", "sum", [np.full(40, 0x3F80, np.uint16), half_ulp], result, 2, kernels)
        assert (result == 0x3F80).all(), kernels
        _core.reduce_elements("bfloat16", "sum", [np.full(40, 0x3F81, np.uint16), half_ulp], result, 2, kernels)
        assert (result == 0x3F82).all(), kernels


def test_unknown_or_unsupported_kernel_set_is_refused():
    words = np.zeros(4, np.uint16)
    with pytest.raises(ValueError, match="kernels must be one of"):
        _core.reduce_elements("bfloat16", "sum", [words], words.copy(), 1, "sse9")


# float32 tiles: the vector sets reduce with AVX2 lanes, the portable set with the baseline
# ISA's; the same operations in the same order must give the same bits (NaN payloads, -0.0,
# subnormals, infinities, max/min with NaN included).
FLOAT32_SPECIAL = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000,
                   0xFFC00001, 0x7F800001, 0x00000001, 0x007FFFFF, 0x80000001, 0x00800000, 0x7F7FFFFF,
                   0x33800000, 0x4B000000, 0x4B000001]


@st.composite
def float32_reductions(draw):
    sources = draw(st.integers(1, 4))
    length = draw(st.integers(0, 2100))  # past one 1024-element tile
    offset = draw(st.integers(0, 17))
    placed = []
    for _ in range(sources):
        backing = np.zeros(offset + length, np.uint32)
        backing[offset:] = word_array(draw, np.uint32, FLOAT32_SPECIAL, length)
        placed.append(backing[offset:].view(np.float32))
    return draw(st.sampled_from(OPS)), placed, offset


@pytest.mark.skipif(not VECTOR_SETS, reason="this CPU runs no vector kernel set (needs AVX2+F16C or AVX-512F)")
@pytest.mark.parametrize("kernels", VECTOR_SETS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=float32_reductions())
def test_float32_vector_tiles_match_portable_bitwise(kernels, case):
    op, sources, offset = case
    expected = np.empty(offset + len(sources[0]), np.float32)[offset:]
    got = np.empty(offset + len(sources[0]), np.float32)[offset:]
    with np.errstate(all="ignore"):
        _core.reduce_elements("float32", op, sources, expected, len(sources), "portable")
        _core.reduce_elements("float32", op, sources, got, len(sources), kernels)
    assert got.tobytes() == expected.tobytes(), (np.flatnonzero(got.view(np.uint32) != expected.view(np.uint32))[:8],
                                                 kernels)


# Sum and avg of half types: a numpy model (widen to float32, add in source order, divide by
# float32(divisor) unless it is 1, round to nearest even, one canonical NaN). Every kernel set
# must give its bits, through the fused one-pass kernel (up to 64 sources) and through the tile
# path that sums of more sources take.
def half_sum_model(dtype, op, sources, divisor):
    with np.errstate(all="ignore"):
        if dtype == "bfloat16":
            widened = [(s.astype(np.uint32) << 16).view(np.float32) for s in sources]
        else:
            widened = [s.view(np.float16).astype(np.float32) for s in sources]
        acc = widened[0].copy()
        for value in widened[1:]:
            acc = acc + value
        if op == "avg" and divisor != 1:
            acc = acc / np.float32(divisor)
        nan = np.isnan(acc)
        if dtype == "bfloat16":
            bits = acc.view(np.uint32)
            out = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            out[nan] = 0x7FC0
        else:
            out = acc.astype(np.float16).view(np.uint16)
            out[nan] = 0x7E00
    return out


@st.composite
def half_sums(draw):
    dtype = draw(st.sampled_from(["bfloat16", "float16"]))
    count = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 64, 65, 70]))
    length = draw(st.integers(0, 100))
    offset = draw(st.integers(0, 17))
    sources = []
    for _ in range(count):
        backing = np.zeros(offset + length, np.uint16)
        backing[offset:] = word_array(draw, np.uint16, SPECIAL[dtype], length)
        sources.append(backing[offset:])
    return dtype, draw(st.sampled_from(["sum", "avg"])), sources, draw(st.integers(1, 9)), offset


@pytest.mark.parametrize("kernels", ["portable", *VECTOR_SETS])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=half_sums())
def test_half_sum_and_avg_match_a_float32_model(kernels, case):
    dtype, op, sources, divisor, offset = case
    got = np.empty(offset + len(sources[0]), np.uint16)[offset:]
    _core.reduce_elements(dtype, op, sources, got, divisor, kernels)
    expected = half_sum_model(dtype, op, sources, divisor)
    assert got.tobytes() == expected.tobytes(), (np.flatnonzero(got != expected)[:8], kernels, len(sources))
