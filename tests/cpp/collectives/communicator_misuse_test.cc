// ctest-labels: concurrent
// The Communicator under the mistakes users make (issue 13): tensors over the
// staging windows, reduce_scatter with more ranks than a chunk holds elements,
// a second call or close() while a collective runs, a peer that arrived and
// then closed. Threads as ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives_test_util.h"
#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::collectives {
namespace {

using namespace std::chrono_literals;
using testing::kTimeout;
using testing::make_communicators;
using testing::run_ranks;

constexpr auto kForever = Communicator::kNoTimeout;

TensorView floats(void* data, std::size_t count) {
  TensorView view;
  view.data = data;
  view.dtype = DLDataType{kDLFloat, 32, 1};
  view.shape = {static_cast<int64_t>(count)};
  view.strides = {1};
  return view;
}

TEST(CommunicatorMisuseTest, ATensorOverAnyRanksStagingWindowsIsRefusedNamingBuffer) {
  auto comms = make_communicators(2, 4096, 4096);
  for (int owner = 0; owner < 2; ++owner) {
    auto* windows = reinterpret_cast<float*>(comms[0]->memory().data(owner));
    try {
      comms[0]->all_reduce(floats(windows + 1000, 64), ReduceOp::kSum, Algorithm::kOneShot, kTimeout);
      ADD_FAILURE() << "accepted a tensor in rank " << owner << "'s staging windows";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("Communicator.buffer()"), std::string::npos) << error.what();
    }
  }
  std::vector<float> out(128);
  EXPECT_THROW(comms[0]->all_gather(floats(comms[0]->memory().data(1), 128), floats(out.data(), 64), kTimeout),
               InvalidArgument);
  // Refusals move nothing and leave the communicators usable; the zero-copy buffer is accepted.
  run_ranks(2, [&](int rank) {
    auto* mine = reinterpret_cast<float*>(comms[rank]->buffer(rank));
    for (int i = 0; i < 64; ++i) mine[i] = static_cast<float>(rank + 1);
    comms[rank]->all_reduce(floats(mine, 64), ReduceOp::kSum, Algorithm::kOneShot, kTimeout);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(mine[i], 3.0f);
  });
}

TEST(CommunicatorMisuseTest, AWindowHoldsOneWidestElementPerRankWhateverMaxBytes) {
  // max_bytes=4096 with 513 float64 ranks: 4104 bytes per chunk; the window used to be 4096.
  EXPECT_GE(Communicator::stage_nbytes_for(4096, 513), std::size_t{513} * 8);
  EXPECT_EQ(Communicator::stage_nbytes_for(4096, 513) % 4096, 0u);
  EXPECT_EQ(Communicator::stage_nbytes_for(4096, 2), 4096u);
  EXPECT_EQ(Communicator::stage_nbytes_for(5000, 2), 8192u);
  EXPECT_GE(Communicator::required_data_nbytes(4096, 0, 1024), 2 * std::size_t{1024} * 8);
  EXPECT_THROW(Communicator::stage_nbytes_for(4096, 0), InvalidArgument);
}

TEST(CommunicatorMisuseTest, ASecondCallWhileACollectiveRunsIsRefusedAtOnceAndCloseEndsTheRunningOne) {
  auto comms = make_communicators(2, 4096);
  std::vector<float> data(16, 1.0f);
  std::atomic<int> outcome{0};  // 1: ended with Closed
  std::thread running([&] {
    try {
      comms[0]->all_reduce(floats(data.data(), 16), ReduceOp::kSum, Algorithm::kOneShot, kForever);  // rank 1 never calls
    } catch (const Closed&) {
      outcome = 1;
    }
  });
  std::this_thread::sleep_for(100ms);
  const auto start = std::chrono::steady_clock::now();
  try {
    comms[0]->barrier(kForever);
    ADD_FAILURE() << "a second call was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("one operation at a time"), std::string::npos) << error.what();
  }
  comms[0]->close();  // before: waited forever for the running operation's lock
  running.join();
  EXPECT_EQ(outcome, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_THROW(comms[0]->barrier(kTimeout), Closed);
}

TEST(CommunicatorMisuseTest, APeerThatArrivedAndThenClosedIsNotJudgedLost) {
  auto comms = make_communicators(2, 4096, 0);
  // Rank 0 waits; its watch (the hook) first lets rank 1 arrive, finish and close, so
  // the liveness check that follows finds rank 1 gone although the barrier is complete.
  bool peer_done = false;
  const sync::WaitHook hook = [&] {
    if (peer_done) return;
    peer_done = true;
    std::thread peer([&] {
      comms[1]->barrier(kTimeout);
      comms[1]->close();
    });
    peer.join();
  };
  EXPECT_NO_THROW(comms[0]->barrier(kTimeout, hook));
  EXPECT_TRUE(peer_done);
}

}  // namespace
}  // namespace tensorxfer::collectives
