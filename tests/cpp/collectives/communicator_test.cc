// ctest-labels: concurrent
// The collectives with threads as ranks: every dtype and op against a
// reference that reduces in rank order, chunking, both algorithms, the
// zero-copy buffer, bitwise equality across ranks, mismatches and timeouts.
#include "tensorxfer/collectives/communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collectives_test_util.h"
#include "reduce_reference.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::collectives {
namespace {

using namespace std::chrono_literals;
using testing::expected_result;
using testing::kTimeout;
using testing::make_communicators;
using testing::make_input;
using testing::run_ranks;
using testing::view_of;


const ElementType kTypes[] = {ElementType::kFloat32, ElementType::kFloat64, ElementType::kBFloat16,
                              ElementType::kFloat16, ElementType::kInt32,   ElementType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

TEST(ReduceTest, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.00390625f), 0x3f80);  // halfway: to even
  EXPECT_EQ(float_to_bfloat16(1.01171875f), 0x3f82);  // halfway: to even (up)
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  EXPECT_EQ(float_to_float16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_float16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_float16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_float16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_float16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_float16(-2.0f), 0xc000);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads
    ASSERT_EQ(float_to_float16(float16_to_float(h)), h) << std::hex << bits;
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0) continue;
    ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(h)), h) << std::hex << bits;
  }
}

TEST(ReduceTest, DestinationMayAliasASource) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  const void* sources[] = {a.data(), b.data()};
  reduce_elements(ElementType::kFloat32, ReduceOp::kSum, sources, 2, 2, b.data(), nullptr, 3);
  EXPECT_EQ(b, (std::vector<float>{11, 22, 33}));
}

struct Case {
  int world;
  Algorithm algorithm;
};

class AllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllReduceTest, EveryDtypeAndOpMatchesTheRankOrderReferenceBitwise) {
  const auto [world, algorithm] = GetParam();
  constexpr std::size_t kMaxBytes = 4096;  // several chunks for the larger counts
  auto comms = make_communicators(world, kMaxBytes);
  const std::size_t counts[] = {0, 1, 7, 1000, 5 * 1024 + 3};
  int seed = 0;
  for (ElementType type : kTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : counts) {
        ++seed;
        const auto expected = expected_result(type, op, world, count, seed);
        std::vector<std::vector<std::byte>> results(world);
        run_ranks(world, [&](int rank) {
          results[rank] = make_input(type, rank, count, seed);
          comms[rank]->all_reduce(view_of(results[rank].data(), type, count), op, algorithm, kTimeout);
        });
        for (int rank = 0; rank < world; ++rank) {
          ASSERT_EQ(results[rank], expected) << "rank " << rank << " type " << static_cast<int>(type) << " op "
                                             << reduce_op_name(op) << " count " << count;
        }
      }
    }
  }
  for (auto& comm : comms) EXPECT_EQ(comm->barrier_sequence(), comms[0]->barrier_sequence());
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllReduceTest,
                         ::testing::Values(Case{1, Algorithm::kOneShot}, Case{2, Algorithm::kOneShot},
                                           Case{2, Algorithm::kTwoShot}, Case{3, Algorithm::kTwoShot},
                                           Case{4, Algorithm::kOneShot}, Case{4, Algorithm::kAuto},
                                           Case{5, Algorithm::kTwoShot}));

TEST(CommunicatorTest, ZeroCopyBufferIsReducedInPlaceByBothAlgorithms) {
  constexpr int kWorld = 3;
  auto comms = make_communicators(kWorld, 4096, 1 << 16);
  for (Algorithm algorithm : {Algorithm::kOneShot, Algorithm::kTwoShot}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{3000}, std::size_t{16000}}) {
      const int seed = static_cast<int>(count);
      const auto expected = expected_result(ElementType::kFloat32, ReduceOp::kSum, kWorld, count, seed);
      run_ranks(kWorld, [&](int rank) {
        std::byte* at = comms[rank]->buffer(rank) + 64;  // same offset on every rank
        const auto input = make_input(ElementType::kFloat32, rank, count, seed);
        std::memcpy(at, input.data(), input.size());
        comms[rank]->all_reduce(view_of(at, ElementType::kFloat32, count), ReduceOp::kSum, algorithm, kTimeout);
        EXPECT_EQ(std::memcmp(at, expected.data(), expected.size()), 0) << "rank " << rank << " count " << count;
      });
    }
  }
}

TEST(CommunicatorTest, AllGatherReduceScatterBroadcast) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_communicators(world, 4096);
    const std::size_t count = 3000;  // several chunks of 4 KiB
    run_ranks(world, [&](int rank) {
      std::vector<int32_t> input(count);
      for (std::size_t i = 0; i < count; ++i) input[i] = rank * 100000 + static_cast<int32_t>(i);
      std::vector<int32_t> gathered(count * world, -1);
      comms[rank]->all_gather(view_of(gathered.data(), ElementType::kInt32, gathered.size()),
                              view_of(input.data(), ElementType::kInt32, count), kTimeout);
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(gathered[r * count + i], r * 100000 + int32_t(i));
      }
      // reduce_scatter: rank r gets block r of the sum; every rank's element j is rank*1000 + j.
      std::vector<int64_t> full(count * world);
      for (std::size_t j = 0; j < full.size(); ++j) full[j] = rank * 1000 + static_cast<int64_t>(j);
      std::vector<int64_t> block(count, -1);
      comms[rank]->reduce_scatter(view_of(block.data(), ElementType::kInt64, count),
                                  view_of(full.data(), ElementType::kInt64, full.size()), ReduceOp::kSum, kTimeout);
      const int64_t rank_sum = 1000LL * world * (world - 1) / 2;
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(block[i], rank_sum + world * static_cast<int64_t>(rank * count + i)) << i;
      }
      for (int root = 0; root < world; ++root) {
        std::vector<double> data(count, rank == root ? 0.5 + root : -1.0);
        comms[rank]->broadcast(view_of(data.data(), ElementType::kFloat64, count), root, kTimeout);
        for (double v : data) ASSERT_EQ(v, 0.5 + root);
      }
      comms[rank]->barrier(kTimeout);
    });
  }
}

TEST(CommunicatorTest, BarrierFlagsOnlyIncreaseAndBarriersOrderWrites) {
  // Each round every rank writes its round number into its zero-copy buffer,
  // passes a barrier, reads every peer's, passes a second barrier (so nobody
  // overwrites before all read). Random delays move ranks in and out of step.
  constexpr int kWorld = 4;
  constexpr int kRounds = 300;
  auto comms = make_communicators(kWorld, 4096, 4096);
  run_ranks(kWorld, [&](int rank) {
    std::mt19937 random(rank);
    Communicator& comm = *comms[rank];
    uint64_t last_flag = comm.memory().barrier_flag;
    for (int round = 1; round <= kRounds; ++round) {
      if (random() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
      std::memcpy(comm.buffer(rank), &round, sizeof(round));
      comm.barrier(kTimeout);
      for (int r = 0; r < kWorld; ++r) {
        int seen = 0;
        std::memcpy(&seen, comm.buffer(r), sizeof(seen));
        ASSERT_EQ(seen, round) << "rank " << rank << " read rank " << r;
      }
      comm.barrier(kTimeout);
      ASSERT_GT(comm.memory().barrier_flag, last_flag);
      last_flag = comm.memory().barrier_flag;
    }
  });
  for (auto& comm : comms) EXPECT_EQ(comm->memory().barrier_flag, 2u * kRounds);
}

TEST(CommunicatorTest, BackToBackAllReducesWithJitterStayBitwiseEqual) {
  constexpr int kWorld = 3;
  auto comms = make_communicators(kWorld, 4096);
  run_ranks(kWorld, [&](int rank) {
    std::mt19937 random(100 + rank);
    for (int round = 0; round < 500; ++round) {
      const std::size_t count = 1 + (round * 37) % 3000;  // shapes change between calls
      if (random() % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % 200));
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1) * 0.5f + float(i % 7);
      comms[rank]->all_reduce(view_of(data.data(), ElementType::kFloat32, count), ReduceOp::kSum,
                              round % 2 ? Algorithm::kTwoShot : Algorithm::kOneShot, kTimeout);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], 3.0f + 3.0f * float(i % 7)) << round;
    }
  });
}

TEST(CommunicatorTest, DifferentCallsOnDifferentRanksFailOnEveryRank) {
  auto comms = make_communicators(2, 4096);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank) {
    std::vector<float> data(rank == 0 ? 10 : 12, 1.0f);
    try {
      comms[rank]->all_reduce(view_of(data.data(), ElementType::kFloat32, data.size()), ReduceOp::kSum,
                              Algorithm::kOneShot, kTimeout);
    } catch (const InvalidArgument& error) {
      errors[rank] = error.what();
    }
  });
  for (const auto& error : errors) EXPECT_NE(error.find("different operations"), std::string::npos) << error;
  std::vector<float> data(4, 1.0f);
  EXPECT_THROW(comms[0]->all_reduce(view_of(data.data(), ElementType::kFloat32, 4), ReduceOp::kSum,
                                    Algorithm::kOneShot, kTimeout),
               InvalidArgument);  // unusable afterwards
}

// Each rank's message after rank r makes call(comm, r) on a fresh pair of communicators.
std::vector<std::string> mismatch_messages(const std::function<void(Communicator&, int)>& call) {
  auto comms = make_communicators(2, 64 << 10, 64 << 10);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank) {
    try {
      call(*comms[rank], rank);
    } catch (const InvalidArgument& error) {
      errors[rank] = error.what();
    }
  });
  return errors;
}

TEST(CommunicatorTest, MismatchesAreNamedInTheCallersWords) {
  struct Case {
    const char* what;
    std::function<void(Communicator&, int)> call;
    std::string rank0, rank1;  // what each rank called, in the message
  };
  std::vector<float> floats(4096, 1.0f);
  std::vector<double> doubles(4096, 1.0);
  const auto floats_of = [&](std::size_t count) { return view_of(floats.data(), ElementType::kFloat32, count); };
  const auto reduce_sum = [&](Communicator& comm, std::size_t count, ReduceOp op = ReduceOp::kSum,
                              Algorithm algorithm = Algorithm::kOneShot) {
    comm.all_reduce(floats_of(count), op, algorithm, kTimeout);
  };
  const std::vector<Case> cases = {
      {"sizes", [&](Communicator& c, int r) { reduce_sum(c, r == 0 ? 1000 : 2000); },
       "all_reduce(SUM, float32, 1000 elements)", "all_reduce(SUM, float32, 2000 elements)"},
      {"dtypes",
       [&](Communicator& c, int r) {
         if (r == 0) reduce_sum(c, 512);
         else c.all_reduce(view_of(doubles.data(), ElementType::kFloat64, 512), ReduceOp::kSum, Algorithm::kOneShot,
                           kTimeout);
       },
       "all_reduce(SUM, float32, 512 elements)", "all_reduce(SUM, float64, 512 elements)"},
      {"reduce ops", [&](Communicator& c, int r) { reduce_sum(c, 8, r == 0 ? ReduceOp::kSum : ReduceOp::kMax); },
       "all_reduce(SUM, float32, 8 elements)", "all_reduce(MAX, float32, 8 elements)"},
      {"algorithms",
       [&](Communicator& c, int r) { reduce_sum(c, 8, ReduceOp::kMin, r == 0 ? Algorithm::kOneShot : Algorithm::kTwoShot); },
       "all_reduce(MIN, float32, 8 elements, one_shot)", "all_reduce(MIN, float32, 8 elements, two_shot)"},
      {"collectives",
       [&](Communicator& c, int r) {
         if (r == 0) c.broadcast(floats_of(10), 1, kTimeout);
         else c.all_gather(floats_of(20), floats_of(10), kTimeout);
       },
       "broadcast(float32, 10 elements, root 1)", "all_gather(float32, 10 elements per rank)"},
      {"barrier",
       [&](Communicator& c, int r) {
         if (r == 0) c.barrier(kTimeout);
         else c.reduce_scatter(floats_of(3), floats_of(6), ReduceOp::kAvg, kTimeout);
       },
       "barrier()", "reduce_scatter(AVG, float32, 6 elements in all)"},
  };
  for (const Case& c : cases) {
    const auto errors = mismatch_messages(c.call);
    EXPECT_NE(errors[0].find("rank 0 called " + c.rank0 + ", rank 1 called " + c.rank1), std::string::npos)
        << c.what << ": " << errors[0];
    EXPECT_NE(errors[1].find("rank 1 called " + c.rank1 + ", rank 0 called " + c.rank0), std::string::npos)
        << c.what << ": " << errors[1];
  }
}

TEST(CommunicatorTest, AMissingRankTimesOutNamingIt) {
  auto comms = make_communicators(3, 4096);
  std::vector<float> data(8, 1.0f);
  run_ranks(2, [&](int rank) {  // rank 2 never calls
    const auto start = std::chrono::steady_clock::now();
    try {
      comms[rank]->all_reduce(view_of(data.data(), ElementType::kFloat32, 0), ReduceOp::kSum, Algorithm::kOneShot,
                              std::chrono::nanoseconds(100ms));
      ADD_FAILURE() << "no timeout";
    } catch (const Timeout& error) {
      EXPECT_NE(std::string(error.what()).find("ranks not arrived: 2"), std::string::npos) << error.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  });
}

TEST(CommunicatorTest, HookRunsWhileWaitingAndCanEndTheWait) {
  auto comms = make_communicators(2, 4096);
  int calls = 0;
  EXPECT_THROW(comms[0]->barrier(std::chrono::nanoseconds(5s),
                                 [&] {
                                   if (++calls == 3) throw std::runtime_error("interrupted");
                                 }),
               std::runtime_error);
  EXPECT_EQ(calls, 3);
}

TEST(CommunicatorTest, RefusesBadArguments) {
  auto comms = make_communicators(2, 4096);
  std::vector<float> data(16, 1.0f);
  TensorView strided = view_of(data.data(), ElementType::kFloat32, 8);
  strided.strides = {2};
  EXPECT_THROW(comms[0]->all_reduce(strided, ReduceOp::kSum, Algorithm::kAuto, kTimeout), InvalidArgument);
  TensorView bytes = TensorView::bytes(data.data(), 64);
  EXPECT_THROW(comms[0]->all_reduce(bytes, ReduceOp::kSum, Algorithm::kAuto, kTimeout), TypeMismatch);
  EXPECT_THROW(comms[0]->broadcast(view_of(data.data(), ElementType::kFloat32, 4), 2, kTimeout), InvalidArgument);
  EXPECT_THROW(parse_reduce_op("prod"), InvalidArgument);
  EXPECT_THROW(parse_algorithm("ring"), InvalidArgument);
  std::vector<float> out(3);
  EXPECT_THROW(comms[0]->all_gather(view_of(out.data(), ElementType::kFloat32, 3),
                                    view_of(data.data(), ElementType::kFloat32, 2), kTimeout),
               InvalidArgument);
  // None of these touched shared state: the communicators still work.
  run_ranks(2, [&](int rank) { comms[rank]->barrier(kTimeout); });
}

}  // namespace
}  // namespace tensorxfer::collectives
