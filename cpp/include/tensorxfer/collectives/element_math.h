// The per-element arithmetic of the CUDA all-reduce, written once for host and
// device: half-precision conversions, the combine step of each op, and how a
// count is cut into per-rank slices and chunks. The kernels
// (cuda_all_reduce_kernels.cu) call these functions; the host tests call the
// same functions and compare them with the host reduction (reduce.h), so the
// GPU and CPU paths agree bit for bit (tests/cpp/collectives/element_math_test.cc).
//
// Semantics (as reduce.h): half types accumulate in float32 and round once to
// nearest even, any NaN narrowing to the canonical quiet NaN; int32 accumulates
// in int64; integer sums wrap; avg divides the sum by the rank count (integers
// truncate toward zero); max/min keep the accumulator unless the new value
// compares greater/less (so a NaN in rank 0 stays, one in a later rank does not
// replace a number). A float32 or float64 result that is a NaN is a NaN on every
// path, but its payload depends on the operand order the compiler picks (half
// types narrow every NaN to one canonical NaN, so they agree bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define TENSORXFER_HOST_DEVICE __host__ __device__
#else
#define TENSORXFER_HOST_DEVICE
#endif

namespace tensorxfer::collectives::element_math {

TENSORXFER_HOST_DEVICE inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
TENSORXFER_HOST_DEVICE inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

TENSORXFER_HOST_DEVICE inline float bfloat16_to_float(uint16_t value) {
  return bits_float(static_cast<uint32_t>(value) << 16);
}

TENSORXFER_HOST_DEVICE inline uint16_t float_to_bfloat16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

TENSORXFER_HOST_DEVICE inline float float16_to_float(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // exact
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

TENSORXFER_HOST_DEVICE inline uint16_t float_to_float16(float value) {
  uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) return 0x7e00u;
  if (bits == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (bits < 0x38800000u) {
    // The float addition rounds the half's subnormal mantissa to nearest even
    // (device code is built without flush-to-zero, so float subnormals stay).
    const float shifted = bits_float(bits) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  const uint32_t odd = (bits >> 13) & 1u;
  bits += 0xc8000fffu + odd;
  return static_cast<uint16_t>(sign | (bits >> 13));
}

// How each stored type is widened into its accumulator and narrowed back.
struct Float32 {
  using storage = float;
  using accumulator = float;
  TENSORXFER_HOST_DEVICE static float load(float value) { return value; }
  TENSORXFER_HOST_DEVICE static float store(float value) { return value; }
};
struct Float64 {
  using storage = double;
  using accumulator = double;
  TENSORXFER_HOST_DEVICE static double load(double value) { return value; }
  TENSORXFER_HOST_DEVICE static double store(double value) { return value; }
};
struct BFloat16 {
  using storage = uint16_t;
  using accumulator = float;
  TENSORXFER_HOST_DEVICE static float load(uint16_t value) { return bfloat16_to_float(value); }
  TENSORXFER_HOST_DEVICE static uint16_t store(float value) { return float_to_bfloat16(value); }
};
struct Float16 {
  using storage = uint16_t;
  using accumulator = float;
  TENSORXFER_HOST_DEVICE static float load(uint16_t value) { return float16_to_float(value); }
  TENSORXFER_HOST_DEVICE static uint16_t store(float value) { return float_to_float16(value); }
};
struct Int32 {
  using storage = int32_t;
  using accumulator = int64_t;
  TENSORXFER_HOST_DEVICE static int64_t load(int32_t value) { return value; }
  TENSORXFER_HOST_DEVICE static int32_t store(int64_t value) { return static_cast<int32_t>(value); }
};
struct Int64 {
  using storage = int64_t;
  using accumulator = int64_t;
  TENSORXFER_HOST_DEVICE static int64_t load(int64_t value) { return value; }
  TENSORXFER_HOST_DEVICE static int64_t store(int64_t value) { return value; }
};

// The ops (the values of reduce.h's ReduceOp).
enum Op : uint32_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

template <typename A>
TENSORXFER_HOST_DEVICE inline A wrapping_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// acc (rank 0 .. k-1 combined) combined with rank k's value.
template <typename A>
TENSORXFER_HOST_DEVICE inline A combine(uint32_t op, A acc, A value) {
  if (op == kMax) return value > acc ? value : acc;
  if (op == kMin) return value < acc ? value : acc;
  return wrapping_add(acc, value);
}

// The last step: avg divides by the rank count.
template <typename A>
TENSORXFER_HOST_DEVICE inline A finish(uint32_t op, A acc, int world_size) {
  return (op == kAvg && world_size != 1) ? acc / static_cast<A>(world_size) : acc;
}

// The reduced value of element i from `world_size` sources, in rank order.
template <typename Kind>
TENSORXFER_HOST_DEVICE inline typename Kind::storage reduce_one(uint32_t op, const typename Kind::storage* const* sources,
                                                                 int world_size, std::size_t i) {
  typename Kind::accumulator acc = Kind::load(sources[0][i]);
  for (int rank = 1; rank < world_size; ++rank) acc = combine(op, acc, Kind::load(sources[rank][i]));
  return Kind::store(finish(op, acc, world_size));
}

// Rank `rank`'s slice of `count` elements cut into `world_size` parts: the first
// count % world_size slices hold one element more. [slice_begin(r), slice_begin(r + 1)).
TENSORXFER_HOST_DEVICE inline std::size_t slice_begin(std::size_t count, int world_size, int rank) {
  const std::size_t parts = static_cast<std::size_t>(world_size);
  const std::size_t index = static_cast<std::size_t>(rank);
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  return base * index + (index < extra ? index : extra);
}

// The rank whose slice holds element i < count (the inverse of slice_begin).
TENSORXFER_HOST_DEVICE inline int slice_owner(std::size_t count, int world_size, std::size_t i) {
  const std::size_t parts = static_cast<std::size_t>(world_size);
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  const std::size_t long_part_end = extra * (base + 1);  // the first `extra` slices hold base + 1
  if (i < long_part_end) return static_cast<int>(i / (base + 1));
  return static_cast<int>(extra + (i - long_part_end) / base);  // base > 0 here: i < count
}

// Elements per chunk: as many as the staging region holds (at least one).
TENSORXFER_HOST_DEVICE inline std::size_t chunk_elements(std::size_t region_nbytes, std::size_t element_size) {
  const std::size_t elements = region_nbytes / element_size;
  return elements == 0 ? 1 : elements;
}

}  // namespace tensorxfer::collectives::element_math
