// ctest-labels: concurrent shm-sweep
// Close paths are fork-safe: a child forked while another thread of the parent
// waits on the ring (and may hold the object's mutex) can close it and exit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using tensorxfer::testing::fork_child;
using tensorxfer::testing::NotePipe;
using tensorxfer::testing::shm_name_exists;
using tensorxfer::testing::wait_exit_code;

using namespace std::chrono_literals;

// The child's exit code, or -1 if it has not exited within `limit` (it is then killed).
int exit_code_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      (void)::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(1ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(SlotRingForkTest, AChildForkedWhileAThreadWaitsClosesAndExits) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support fork() while other threads run";
#endif
  // A waiter that spins polls its ring under the object's mutex most of the
  // time, so forks below often copy that mutex locked.
  auto consumer = SlotRing::create(2, 64, sync::SpinPolicy::fixed(sync::SpinPolicy::kFixedMax));
  auto producer = SlotRing::attach(consumer->name(), sync::SpinPolicy::fixed(sync::SpinPolicy::kFixedMax));
  (void)producer->acquire_free(1s);
  (void)producer->acquire_free(1s);  // the ring is full: the producer thread below waits
  std::atomic<bool> stop{false};
  auto wait_loop = [&stop](SlotRing& ring, bool consume) {
    while (!stop.load()) {
      try {
        if (consume) {
          (void)ring.acquire_ready(50ms);
        } else {
          (void)ring.acquire_free(50ms);
        }
      } catch (const Timeout&) {
      }
    }
  };
  std::thread consumer_waiter(wait_loop, std::ref(*consumer), true);
  std::thread producer_waiter(wait_loop, std::ref(*producer), false);
  std::this_thread::sleep_for(20ms);
  int hung = 0;
  for (int round = 0; round < 20; ++round) {
    const pid_t child = fork_child([&] {
      producer->close();
      consumer->close();
      producer.reset();
      consumer.reset();
      return 0;
    });
    const int code = exit_code_within(child, 2000ms);
    if (code == -1) ++hung;
    EXPECT_TRUE(code == 0 || code == -1) << "child exited with " << code;
  }
  stop.store(true);
  consumer_waiter.join();
  producer_waiter.join();
  EXPECT_EQ(hung, 0) << hung << " of 20 forked children hung in close()";
  // The children's closes did not touch the parent's ring.
  EXPECT_FALSE(consumer->is_closed());
  EXPECT_TRUE(shm_name_exists(consumer->name()));
  EXPECT_EQ(consumer->live_producers(), 1u);
}

// A producer forked from the consumer's process inherits its descriptors; it
// must not keep the consumer's liveness lock (and so the consumer) "alive".
TEST(SlotRingForkTest, AProducerForkedFromTheConsumerStillSeesItDie) {
  NotePipe pipe;
  const pid_t consumer = fork_child([&] {
    auto ring = SlotRing::create(1, 64);
    pipe.send(ring->name());
    (void)fork_child([&] {
      auto producer = SlotRing::attach(ring->name());
      (void)producer->acquire_free(1s);  // the only slot
      pipe.send("waiting");
      try {
        (void)producer->acquire_free(10s);
        pipe.send("no error");
      } catch (const PeerLost&) {
        pipe.send("peer lost");
      } catch (const Timeout&) {
        pipe.send("timeout");
      }
      return 0;
    });
    ::pause();
    return 0;
  });
  const std::string name = pipe.receive();
  ASSERT_EQ(pipe.receive(), "waiting");
  ::kill(consumer, SIGKILL);
  ASSERT_EQ(wait_exit_code(consumer), 128 + SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(pipe.receive(), "peer lost");
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited_ms, 2000.0);
  EXPECT_FALSE(shm_name_exists(name));
}

}  // namespace
}  // namespace tensorxfer::ipc
