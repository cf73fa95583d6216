// element_math.h is the CUDA all-reduce's per-element arithmetic; here the host
// runs it against the host reduction's own loops (reduce.h: tiles, and the AVX2 /
// AVX-512 half kernels), bit for bit, and checks the slice and chunk arithmetic the
// kernels index with. The half conversions are the host's too (reduce.cc calls
// element_math.h): ReduceTest.HalfConversionsRoundToNearestEven tests them.
#include "tensorxfer/collectives/element_math.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "tensorxfer/collectives/reduce.h"

namespace tensorxfer::collectives {
namespace {

namespace math = element_math;

template <typename Kind>
void expect_reduce_one_matches_the_host(ElementType type, std::mt19937& random) {
  using S = typename Kind::storage;
  constexpr std::size_t kCount = 4099;
  for (int world : {1, 2, 3, 5, 16}) {
    std::vector<std::vector<S>> inputs(static_cast<std::size_t>(world), std::vector<S>(kCount));
    for (auto& input : inputs) {
      for (S& element : input) {
        uint64_t bits = (uint64_t{random()} << 32) | random();
        if (random() % 16 == 0) bits = 0;
        std::memcpy(&element, &bits, sizeof(S));  // any bit pattern: NaNs, infinities, subnormals, wrapping sums
      }
    }
    std::vector<const void*> host_sources;
    std::vector<const S*> sources;
    for (auto& input : inputs) {
      host_sources.push_back(input.data());
      sources.push_back(input.data());
    }
    for (uint32_t op = math::kSum; op <= math::kMin; ++op) {
      for (HalfKernels kernels : {HalfKernels::kPortable, HalfKernels::kAuto}) {
        std::vector<S> expected(kCount);
        reduce_elements(type, static_cast<ReduceOp>(op), host_sources.data(), world, world, expected.data(),
                        nullptr, kCount, kernels);
        for (std::size_t i = 0; i < kCount; ++i) {
          const S got = math::reduce_one<Kind>(op, sources.data(), world, i);
          if constexpr (std::is_floating_point_v<S>) {
            // Which NaN a float sum of NaNs gives depends on the operand order the compiler
            // (or the GPU) picks: a NaN it must be, its payload is unspecified.
            if (expected[i] != expected[i]) {
              ASSERT_NE(got, got) << "type " << static_cast<int>(type) << " op " << op << " element " << i;
              continue;
            }
          }
          ASSERT_EQ(std::memcmp(&got, &expected[i], sizeof(S)), 0)
              << "type " << static_cast<int>(type) << " op " << op << " world " << world << " element " << i
              << " kernels " << half_kernels_name(kernels);
        }
      }
    }
  }
}

TEST(ElementMathTest, ReduceOneIsTheHostReductionForEveryTypeOpAndWorldSize) {
  std::mt19937 random(11);
  expect_reduce_one_matches_the_host<math::Float32>(ElementType::kFloat32, random);
  expect_reduce_one_matches_the_host<math::Float64>(ElementType::kFloat64, random);
  expect_reduce_one_matches_the_host<math::BFloat16>(ElementType::kBFloat16, random);
  expect_reduce_one_matches_the_host<math::Float16>(ElementType::kFloat16, random);
  expect_reduce_one_matches_the_host<math::Int32>(ElementType::kInt32, random);
  expect_reduce_one_matches_the_host<math::Int64>(ElementType::kInt64, random);
}

TEST(ElementMathTest, OpValuesAreReduceOpValues) {
  EXPECT_EQ(math::kSum, static_cast<uint32_t>(ReduceOp::kSum));
  EXPECT_EQ(math::kAvg, static_cast<uint32_t>(ReduceOp::kAvg));
  EXPECT_EQ(math::kMax, static_cast<uint32_t>(ReduceOp::kMax));
  EXPECT_EQ(math::kMin, static_cast<uint32_t>(ReduceOp::kMin));
}

TEST(ElementMathTest, SlicesPartitionTheCountAndTheOwnerInvertsThem) {
  std::vector<std::size_t> counts;
  for (std::size_t count = 0; count < 300; ++count) counts.push_back(count);
  for (std::size_t count : {std::size_t{1} << 20, (std::size_t{1} << 20) + 7, std::size_t{1} << 40}) {
    counts.push_back(count);
  }
  for (std::size_t count : counts) {
    for (int world = 1; world <= 16; ++world) {
      ASSERT_EQ(math::slice_begin(count, world, 0), 0u);
      ASSERT_EQ(math::slice_begin(count, world, world), count) << count << " " << world;
      for (int rank = 0; rank < world; ++rank) {
        const std::size_t begin = math::slice_begin(count, world, rank);
        const std::size_t end = math::slice_begin(count, world, rank + 1);
        ASSERT_LE(begin, end);
        ASSERT_LE(end - begin, count / world + 1);  // balanced: sizes differ by at most one
        ASSERT_GE(end - begin, count / world);
        if (count <= 300) {
          for (std::size_t i = begin; i < end; ++i) ASSERT_EQ(math::slice_owner(count, world, i), rank) << count;
        } else if (begin < end) {
          ASSERT_EQ(math::slice_owner(count, world, begin), rank);
          ASSERT_EQ(math::slice_owner(count, world, end - 1), rank);
        }
      }
    }
  }
}

TEST(ElementMathTest, ChunksHoldWhatTheRegionHoldsAndAtLeastOneElement) {
  EXPECT_EQ(math::chunk_elements(64 << 10, 4), std::size_t{16384});
  EXPECT_EQ(math::chunk_elements(64 << 10, 8), std::size_t{8192});
  EXPECT_EQ(math::chunk_elements(10, 4), std::size_t{2});
  EXPECT_EQ(math::chunk_elements(4, 8), std::size_t{1});
}

}  // namespace
}  // namespace tensorxfer::collectives
