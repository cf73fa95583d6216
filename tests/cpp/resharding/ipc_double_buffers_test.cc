// IpcDoubleBuffers' wait: the barriers of one call share one deadline.
#include "tensorxfer/resharding/ipc_double_buffers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "collectives/collectives_test_util.h"
#include "group/group_test_util.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

using namespace std::chrono_literals;
using group::LocalGroup;

// Rank 1 enters three barriers 0.6 s apart; rank 0 waits for them after one set_wait of
// 1 s. Each wait is shorter than 1 s, the three together are not: rank 0 must give up at
// its one deadline (before, every barrier started the timeout again and all three passed).
TEST(IpcDoubleBuffersTest, TheBarriersOfOneCallShareOneDeadline) {
  constexpr std::size_t kSlot = 64;
  const std::string name = testing::unique_group_name("double-buffers-deadline");
  std::vector<std::unique_ptr<LocalGroup>> groups(2);
  testing::run_ranks(2, [&](int rank) { groups[rank] = LocalGroup::join(name, rank, 2, 10s); });
  auto memories = testing::make_ipc_group(2, IpcDoubleBuffers::region_nbytes(kSlot));
  std::chrono::steady_clock::duration waited{};
  bool timed_out = false;
  testing::run_ranks(2, [&](int rank) {
    IpcDoubleBuffers buffers(memories[rank], *groups[rank], kSlot);
    if (rank == 1) {
      buffers.set_wait(10s, {});
      for (int i = 0; i < 3; ++i) {
        std::this_thread::sleep_for(600ms);
        try {
          buffers.barrier();
        } catch (const Error&) {
          return;  // rank 0 gave up: its group is no longer in step
        }
      }
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    buffers.set_wait(1s, {});
    try {
      for (int i = 0; i < 3; ++i) buffers.barrier();
    } catch (const Timeout&) {
      timed_out = true;
    }
    waited = std::chrono::steady_clock::now() - start;
    groups[0]->close();  // rank 1 is not left waiting in its next barrier
  });
  EXPECT_TRUE(timed_out);
  EXPECT_GE(waited, 900ms);
  EXPECT_LT(waited, 1500ms);
}

}  // namespace
}  // namespace tensorxfer::resharding
