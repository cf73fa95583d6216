// SlotRing handoffs between two processes (no Python): round trips through
// two rings, and the one-way latency of a 64-byte batch published every
// 0.5 ms to a consumer that is already waiting. Arg = spin budget in us
// (-1 = the standard policy, the default); both sides use it.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu_context.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using namespace std::chrono_literals;

sync::SpinPolicy policy_for(int64_t spin_us) {
  return spin_us < 0 ? sync::SpinPolicy::standard()
                     : sync::SpinPolicy::fixed(std::chrono::microseconds(spin_us));
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

double thread_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

bool write_all(int fd, const void* data, std::size_t n) { return ::write(fd, data, n) == static_cast<ssize_t>(n); }
bool read_all(int fd, void* data, std::size_t n) { return ::read(fd, data, n) == static_cast<ssize_t>(n); }

// Parent -> child through the child's ring, child -> parent through the parent's.
void BM_RingRoundTripProcesses(benchmark::State& state) {
  const auto spin = policy_for(state.range(0));
  auto back = SlotRing::create(4, 64, spin);
  char back_name[128] = {};
  std::strncpy(back_name, back->name().c_str(), sizeof(back_name) - 1);
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return state.SkipWithError("pipe");
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      auto forth = SlotRing::create(4, 64, spin);
      char name[128] = {};
      std::strncpy(name, forth->name().c_str(), sizeof(name) - 1);
      if (!write_all(pipe_fds[1], name, sizeof(name))) ::_exit(1);
      auto reply = SlotRing::attach(back_name, spin);
      for (;;) {
        const ReadySlot ready = forth->acquire_ready(10s);
        forth->release(ready.slot);
        if (ready.tick_id == 0) break;  // the parent is done
        const uint32_t slot = reply->acquire_free(10s);
        reply->publish(slot, ready.tick_id);
      }
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);  // the rings above closed (and unlinked) when their scope ended
  }
  char forth_name[128] = {};
  if (!read_all(pipe_fds[0], forth_name, sizeof(forth_name))) return state.SkipWithError("child did not start");
  {
    auto forth = SlotRing::attach(forth_name, spin);
    uint64_t tick = 0;
    for (auto _ : state) {
      const uint32_t slot = forth->acquire_free(10s);
      forth->publish(slot, ++tick);
      const ReadySlot ready = back->acquire_ready(10s);
      back->release(ready.slot);
    }
    forth->publish(forth->acquire_free(10s), 0);  // tell the child to stop
  }
  ::waitpid(child, nullptr, 0);
  back->close();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}
BENCHMARK(BM_RingRoundTripProcesses)->Arg(0)->Arg(50)->Arg(200)->Arg(-1)->UseRealTime();

// The handoff case: one batch every 0.5 ms, consumer already waiting.
// Reports p50/p99 of publish -> acquire_ready return, in microseconds, the
// consumer thread's CPU use in percent of a core.
void BM_RingLatencyEvery500us(benchmark::State& state) {
  const auto spin = policy_for(state.range(0));
  constexpr int kBatches = 2000;
  for (auto _ : state) {
    auto ring = SlotRing::create(4, 64, spin);
    const std::string name = ring->name();
    const pid_t child = ::fork();
    if (child == 0) {
      try {
        auto producer = SlotRing::attach(name, spin);
        auto next = std::chrono::steady_clock::now() + 100ms;
        for (int i = 0; i < kBatches; ++i) {
          next += 500us;
          std::this_thread::sleep_until(next);
          const uint32_t slot = producer->acquire_free(10s);
          producer->publish(slot, static_cast<uint64_t>(i));
        }
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    std::vector<double> latencies;
    latencies.reserve(kBatches);
    const double cpu_begin = thread_cpu_seconds();
    const auto wall_begin = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatches; ++i) {
      const ReadySlot ready = ring->acquire_ready(10s);
      latencies.push_back(static_cast<double>(now_ns() - ready.publish_ns) / 1000.0);
      ring->release(ready.slot);
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_begin).count();
    state.counters["cpu_pct"] = 100.0 * (thread_cpu_seconds() - cpu_begin) / wall;
    ::waitpid(child, nullptr, 0);
    std::sort(latencies.begin() + 100, latencies.end());  // skip warm-up
    const std::size_t n = latencies.size() - 100;
    state.counters["p50_us"] = latencies[100 + n / 2];
    state.counters["p99_us"] = latencies[100 + n * 99 / 100];
  }
}
BENCHMARK(BM_RingLatencyEvery500us)->Arg(0)->Arg(50)->Arg(200)->Arg(1000)->Arg(-1)->Iterations(1)->UseRealTime();

}  // namespace
}  // namespace tensorxfer::ipc
