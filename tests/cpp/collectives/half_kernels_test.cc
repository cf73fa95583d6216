// Every half-precision kernel set this CPU runs narrows and widens bitwise like
// the portable loops, over a spread of float32 bit patterns (all exponents,
// subnormals, NaNs, values that round to inf) and every 16-bit pattern (NaN
// payloads aside while in float32: narrowing makes every NaN the canonical one).
#include "../../../cpp/src/collectives/half_kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
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

std::vector<float> float_patterns() {
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 0x1003) {  // ~1M patterns, every exponent
    const auto word = static_cast<uint32_t>(bits);
    float value;
    std::memcpy(&value, &word, sizeof(value));
    values.push_back(value);
  }
  return values;
}

TEST(HalfKernelsTest, NarrowMatchesPortableBitwiseOnEverySet) {
  if (vector_sets().empty()) GTEST_SKIP() << "this CPU runs no vector kernel set";
  const std::vector<float> values = float_patterns();
  for (bool bfloat16 : {true, false}) {
    std::vector<uint16_t> expected(values.size()), got(values.size());
    half_tiles::half_tile_kernels(HalfKernels::kPortable, bfloat16)->narrow(values.data(), expected.data(),
                                                                             values.size());
    for (HalfKernels kernels : vector_sets()) {
      // An odd offset and length: unaligned vectors and a scalar tail.
      half_tiles::half_tile_kernels(kernels, bfloat16)->narrow(values.data() + 1, got.data() + 1, values.size() - 2);
      for (std::size_t i = 1; i + 1 < values.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &values[i], sizeof(bits));
        ASSERT_EQ(got[i], expected[i]) << half_kernels_name(kernels) << (bfloat16 ? " bfloat16" : " float16")
                                       << " float bits 0x" << std::hex << bits;
      }
    }
  }
}

TEST(HalfKernelsTest, WidenAndWidenAddMatchPortableBitwiseOnEverySet) {
  if (vector_sets().empty()) GTEST_SKIP() << "this CPU runs no vector kernel set";
  std::vector<uint16_t> words(1 << 16);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = static_cast<uint16_t>(i * 40503u);  // a permutation
  for (bool bfloat16 : {true, false}) {
    const auto* portable = half_tiles::half_tile_kernels(HalfKernels::kPortable, bfloat16);
    std::vector<float> expected(words.size()), got(words.size());
    portable->widen(words.data(), expected.data(), words.size());
    std::vector<float> expected_sum(expected);
    portable->widen_add(words.data() + 0, expected_sum.data(), words.size());
    for (HalfKernels kernels : vector_sets()) {
      const auto* set = half_tiles::half_tile_kernels(kernels, bfloat16);
      set->widen(words.data(), got.data(), words.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        // F16C quiets a signalling NaN as it widens; NaNs narrow to one canonical NaN anyway.
        if (expected[i] != expected[i]) {
          ASSERT_NE(got[i], got[i]) << half_kernels_name(kernels) << " word 0x" << std::hex << words[i];
          continue;
        }
        ASSERT_EQ(std::memcmp(&got[i], &expected[i], sizeof(float)), 0)
            << half_kernels_name(kernels) << " word 0x" << std::hex << words[i];
      }
      set->widen_add(words.data(), got.data(), words.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != got[i]) continue;  // NaN + NaN keeps either operand's payload; narrowing canonicalises it
        ASSERT_EQ(std::memcmp(&got[i], &expected_sum[i], sizeof(float)), 0) << half_kernels_name(kernels) << " " << i;
      }
    }
  }
}

TEST(HalfKernelsTest, AutoIsTheWidestSupportedSet) {
  const HalfKernels best = best_half_kernels();
  EXPECT_TRUE(half_kernels_supported(best));
  EXPECT_NE(best, HalfKernels::kAuto);
  if (half_kernels_supported(HalfKernels::kAvx512)) EXPECT_EQ(best, HalfKernels::kAvx512);
  EXPECT_EQ(half_tiles::half_tile_kernels(HalfKernels::kAuto, true), half_tiles::half_tile_kernels(best, true));
}

}  // namespace
}  // namespace tensorxfer::collectives
