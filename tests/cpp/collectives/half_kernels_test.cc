// Every half-precision reduction set this CPU runs gives bitwise the portable
// loop's results, for every op, over every 16-bit pattern as inputs (NaNs,
// infinities, subnormals), with averages by odd divisors so that the float32
// results before narrowing take arbitrary bit patterns (rounding ties, values
// that round to inf or to subnormals).
#include "../../../cpp/src/collectives/half_kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tensorxfer::collectives {
namespace {

std::vector<HalfKernels> vector_sets() {
  std::vector<HalfKernels> sets;
  for (HalfKernels kernels : {HalfKernels::kAvx2, HalfKernels::kAvx512}) {
    if (half_kernels_supported(kernels)) sets.push_back(kernels);
  }
  return sets;
}

// Every 16-bit word once, in an order set by `step` (odd: a permutation).
std::vector<uint16_t> words_in_order(uint32_t step) {
  std::vector<uint16_t> words(1 << 16);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<uint16_t>(i * step);
  return words;
}

TEST(HalfKernelsTest, EveryOpMatchesPortableBitwiseOnEverySet) {
  if (vector_sets().empty()) GTEST_SKIP() << "this CPU runs no vector kernel set";
  const std::vector<std::vector<uint16_t>> inputs{words_in_order(1), words_in_order(40503), words_in_order(7),
                                                  words_in_order(2053), words_in_order(65521)};
  struct Case { ReduceOp op; int divisor; };
  const Case cases[] = {{ReduceOp::kSum, 1}, {ReduceOp::kAvg, 1}, {ReduceOp::kAvg, 3}, {ReduceOp::kAvg, 7},
                        {ReduceOp::kMax, 1}, {ReduceOp::kMin, 1}};
  for (bool bfloat16 : {true, false}) {
    for (int count = 1; count <= static_cast<int>(inputs.size()); ++count) {
      // An odd offset and length: unaligned vectors and a scalar tail.
      std::vector<const void*> sources;
      for (int k = 0; k < count; ++k) sources.push_back(inputs[static_cast<std::size_t>(k)].data() + 1);
      const std::size_t n = inputs[0].size() - 2;
      for (const Case& c : cases) {
        std::vector<uint16_t> expected(n), got(n), second(n);
        half_kernels::half_reduce(HalfKernels::kPortable, bfloat16)(c.op, sources.data(), count, c.divisor,
                                                                     expected.data(), nullptr, n);
        for (HalfKernels kernels : vector_sets()) {
          half_kernels::half_reduce(kernels, bfloat16)(c.op, sources.data(), count, c.divisor, got.data(),
                                                       second.data(), n);
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(got[i], expected[i]) << half_kernels_name(kernels) << (bfloat16 ? " bfloat16" : " float16")
                                           << " op " << reduce_op_name(c.op) << " / " << c.divisor << ", "
                                           << count << " sources, element " << i;
          }
          ASSERT_EQ(second, got) << "the second destination holds the result too";
        }
      }
    }
  }
}

TEST(HalfKernelsTest, AutoIsTheWidestSupportedSet) {
  const HalfKernels best = best_half_kernels();
  EXPECT_TRUE(half_kernels_supported(best));
  EXPECT_NE(best, HalfKernels::kAuto);
  if (half_kernels_supported(HalfKernels::kAvx512)) EXPECT_EQ(best, HalfKernels::kAvx512);
  EXPECT_EQ(half_kernels::half_reduce(HalfKernels::kAuto, true), half_kernels::half_reduce(best, true));
}

}  // namespace
}  // namespace tensorxfer::collectives
