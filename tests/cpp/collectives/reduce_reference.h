// The expected results of the collectives tests, written independently of reduce.cc: each
// rank's input (small multiples of 1/4, exact in every type), the rank-order reduction one
// element at a time, and a TensorView of a flat buffer.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::testing {

using namespace tensorxfer::collectives;  // ElementType, ReduceOp and the half conversions

inline DLDataType dl_type(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: return {kDLFloat, 32, 1};
    case ElementType::kFloat64: return {kDLFloat, 64, 1};
    case ElementType::kBFloat16: return {kDLBfloat, 16, 1};
    case ElementType::kFloat16: return {kDLFloat, 16, 1};
    case ElementType::kInt32: return {kDLInt, 32, 1};
    case ElementType::kInt64: return {kDLInt, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

inline TensorView view_of(void* data, ElementType type, std::size_t count) {
  TensorView view;
  view.data = data;
  view.dtype = dl_type(type);
  view.shape = {static_cast<int64_t>(count)};
  view.strides = {1};
  return view;
}

// Rank r's input value at element i as a double: small multiples of 1/4 (exact in every type).
inline double input_value(int rank, std::size_t i, int seed) {
  const auto mixed = static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(rank) * 40503u +
                     static_cast<uint64_t>(seed) * 97u;
  return static_cast<double>(static_cast<int>(mixed % 33) - 16) * 0.25;
}
inline double integer_input(int rank, std::size_t i, int seed) { return std::floor(input_value(rank, i, seed) * 1000.0); }

// Bytes of `count` elements of `type` for rank `rank`.
inline std::vector<std::byte> make_input(ElementType type, int rank, std::size_t count, int seed) {
  std::vector<std::byte> bytes(count * element_size(type));
  for (std::size_t i = 0; i < count; ++i) {
    const double v = input_value(rank, i, seed);
    void* at = bytes.data() + i * element_size(type);
    switch (type) {
      case ElementType::kFloat32: { const float f = static_cast<float>(v); std::memcpy(at, &f, 4); break; }
      case ElementType::kFloat64: std::memcpy(at, &v, 8); break;
      case ElementType::kBFloat16: { const uint16_t h = float_to_bfloat16(static_cast<float>(v)); std::memcpy(at, &h, 2); break; }
      case ElementType::kFloat16: { const uint16_t h = float_to_float16(static_cast<float>(v)); std::memcpy(at, &h, 2); break; }
      case ElementType::kInt32: { const auto x = static_cast<int32_t>(integer_input(rank, i, seed)); std::memcpy(at, &x, 4); break; }
      case ElementType::kInt64: { const auto x = static_cast<int64_t>(integer_input(rank, i, seed)) * (int64_t{1} << 20); std::memcpy(at, &x, 8); break; }
    }
  }
  return bytes;
}

// The expected result, written independently of reduce.cc: rank order, one element at a time.
inline std::vector<std::byte> expected_result(ElementType type, ReduceOp op, int world, std::size_t count, int seed) {
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(make_input(type, r, count, seed));
  std::vector<std::byte> out(count * element_size(type));
  auto combine = [op](auto acc, auto value) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: return static_cast<decltype(acc)>(acc + value);
      case ReduceOp::kMax: return value > acc ? value : acc;
      case ReduceOp::kMin: return value < acc ? value : acc;
    }
    return acc;
  };
  for (std::size_t i = 0; i < count; ++i) {
    auto element = [&](int r) { return inputs[r].data() + i * element_size(type); };
    void* at = out.data() + i * element_size(type);
    if (type == ElementType::kFloat32 || type == ElementType::kBFloat16 || type == ElementType::kFloat16) {
      auto load = [&](int r) {
        uint16_t h;
        float f;
        if (type == ElementType::kFloat32) { std::memcpy(&f, element(r), 4); return f; }
        std::memcpy(&h, element(r), 2);
        return type == ElementType::kBFloat16 ? bfloat16_to_float(h) : float16_to_float(h);
      };
      float acc = load(0);
      for (int r = 1; r < world; ++r) acc = combine(acc, load(r));
      if (op == ReduceOp::kAvg) acc = acc / static_cast<float>(world);
      if (type == ElementType::kFloat32) { std::memcpy(at, &acc, 4); continue; }
      const uint16_t h = type == ElementType::kBFloat16 ? float_to_bfloat16(acc) : float_to_float16(acc);
      std::memcpy(at, &h, 2);
    } else if (type == ElementType::kFloat64) {
      double acc, v;
      std::memcpy(&acc, element(0), 8);
      for (int r = 1; r < world; ++r) { std::memcpy(&v, element(r), 8); acc = combine(acc, v); }
      if (op == ReduceOp::kAvg) acc = acc / world;
      std::memcpy(at, &acc, 8);
    } else if (type == ElementType::kInt32) {
      int32_t v;
      std::memcpy(&v, element(0), 4);
      int64_t acc = v;
      for (int r = 1; r < world; ++r) { std::memcpy(&v, element(r), 4); acc = combine(acc, int64_t{v}); }
      if (op == ReduceOp::kAvg) acc = acc / world;
      const auto result = static_cast<int32_t>(acc);
      std::memcpy(at, &result, 4);
    } else {
      int64_t acc, v;
      std::memcpy(&acc, element(0), 8);
      for (int r = 1; r < world; ++r) { std::memcpy(&v, element(r), 8); acc = combine(acc, v); }
      if (op == ReduceOp::kAvg) acc = acc / world;
      std::memcpy(at, &acc, 8);
    }
  }
  return out;
}

}  // namespace tensorxfer::testing
