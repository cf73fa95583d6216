// Collectives above the streaming threshold (32 MiB): the gather writes with non-temporal
// stores. Not in the TSan run (no `concurrent` label): ThreadSanitizer models the C++ memory
// model, not the weak ordering of non-temporal stores that these tests are about, and the
// 32 MiB reductions took 60 of its 65 s. The threads-as-ranks protocol is the same as in
// communicator_test.cc, which TSan runs.
#include <gtest/gtest.h>

#include <cstring>

#include "collectives_test_util.h"
#include "reduce_reference.h"
#include "tensorxfer/collectives/communicator.h"

namespace tensorxfer::collectives {
namespace {

using testing::expected_result;
using testing::kTimeout;
using testing::make_communicators;
using testing::make_input;
using testing::run_ranks;
using testing::view_of;

TEST(CommunicatorTest, LargeZeroCopyReduceGathersWithStreamingStores) {
  // >= 32 MiB in the buffer: the gather writes with non-temporal stores (an odd
  // element count leaves unaligned heads and tails); every rank must still read
  // the exact result right after the call, twice in a row.
  constexpr int kWorld = 2;
  constexpr std::size_t kCount = (std::size_t{32} << 20) / 4 + 7;
  auto comms = make_communicators(kWorld, 4096, kCount * 4 + 64);
  for (int seed : {1, 2}) {
    const auto expected = expected_result(ElementType::kFloat32, ReduceOp::kSum, kWorld, kCount, seed);
    run_ranks(kWorld, [&](int rank) {
      std::byte* at = comms[rank]->buffer(rank) + 4;  // same (unaligned) offset on every rank
      const auto input = make_input(ElementType::kFloat32, rank, kCount, seed);
      std::memcpy(at, input.data(), input.size());
      comms[rank]->all_reduce(view_of(at, ElementType::kFloat32, kCount), ReduceOp::kSum, Algorithm::kAuto, kTimeout);
      EXPECT_EQ(std::memcmp(at, expected.data(), expected.size()), 0) << "rank " << rank << " seed " << seed;
    });
  }
}

TEST(CommunicatorTest, LargeStagedReduceGathersWithStreamingStores) {
  // >= 32 MiB of a private tensor: the staged two-shot gather writes the peers'
  // slices with non-temporal stores, chunk by chunk (an odd element count and an
  // unaligned start leave unaligned heads and tails in every slice); every rank
  // must read the exact result right after the call, for float32 and bfloat16.
  constexpr int kWorld = 3;
  auto comms = make_communicators(kWorld, 1 << 20);
  for (ElementType type : {ElementType::kFloat32, ElementType::kBFloat16}) {
    const std::size_t element = type == ElementType::kFloat32 ? 4 : 2;
    const std::size_t count = (std::size_t{32} << 20) / element + 7;
    const int seed = static_cast<int>(element);
    const auto expected = expected_result(type, ReduceOp::kSum, kWorld, count, seed);
    run_ranks(kWorld, [&](int rank) {
      auto input = make_input(type, rank, count, seed);
      std::vector<std::byte> storage(input.size() + element);
      std::byte* at = storage.data() + element;  // not 64-byte aligned
      std::memcpy(at, input.data(), input.size());
      comms[rank]->all_reduce(view_of(at, type, count), ReduceOp::kSum, Algorithm::kTwoShot, kTimeout);
      EXPECT_EQ(std::memcmp(at, expected.data(), expected.size()), 0) << "rank " << rank << " element " << element;
    });
  }
}

}  // namespace
}  // namespace tensorxfer::collectives
