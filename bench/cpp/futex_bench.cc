// Wait/wake round trips through EventCount (spin-then-futex), across threads
// and across processes, with several spin budgets. Arg = spin budget in us,
// -1 = the standard policy (the default). A round trip is: A publishes, B
// (waiting) sees it and answers, A (waiting) sees the answer.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <chrono>
#include <optional>
#include <thread>

#include "cpu_context.h"
#include "tensorxfer/sync/futex.h"

namespace tensorxfer::sync {
namespace {

using namespace std::chrono_literals;

struct PingPong {
  EventCount ping_event;
  EventCount pong_event;
  SharedWord32 ping;
  SharedWord32 pong;
  SharedWord32 stop;
};

SpinPolicy policy_for(int64_t spin_us) {
  return spin_us < 0 ? SpinPolicy::standard() : SpinPolicy::fixed(std::chrono::microseconds(spin_us));
}

// The answering side: echoes every ping until told to stop.
void answer(PingPong& shared, SpinPolicy spin) {
  uint32_t seen = 0;
  for (;;) {
    const auto status = shared.ping_event.await(
        [&] {
          return shared.ping.load(std::memory_order_acquire) != seen || shared.stop.load(std::memory_order_acquire);
        },
        WaitClock::now() + 10s, spin, [] {});
    if (status != WaitStatus::kReady || shared.stop.load(std::memory_order_acquire)) return;
    seen = shared.ping.load(std::memory_order_acquire);
    shared.pong.store(seen, std::memory_order_release);
    shared.pong_event.notify_all();
  }
}

void round_trips(benchmark::State& state, PingPong& shared, SpinPolicy spin) {
  uint32_t sequence = 0;
  for (auto _ : state) {
    ++sequence;
    shared.ping.store(sequence, std::memory_order_release);
    shared.ping_event.notify_all();
    const auto status = shared.pong_event.await(
        [&] { return shared.pong.load(std::memory_order_acquire) == sequence; }, WaitClock::now() + 10s, spin,
        [] {});
    if (status != WaitStatus::kReady) {
      state.SkipWithError("partner did not answer within 10 s");
      break;
    }
  }
  shared.stop.store(1, std::memory_order_release);
  shared.ping_event.notify_all();
}

void BM_RoundTripThreads(benchmark::State& state) {
  PingPong shared{};
  const SpinPolicy spin = policy_for(state.range(0));
  std::thread partner(answer, std::ref(shared), spin);
  round_trips(state, shared, spin);
  partner.join();
}
BENCHMARK(BM_RoundTripThreads)->Arg(0)->Arg(20)->Arg(50)->Arg(200)->Arg(-1)->UseRealTime();

void BM_RoundTripProcesses(benchmark::State& state) {
  void* memory = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    state.SkipWithError("mmap failed");
    return;
  }
  auto* shared = new (memory) PingPong{};
  const SpinPolicy spin = policy_for(state.range(0));
  const pid_t partner = ::fork();
  if (partner == 0) {
    answer(*shared, spin);
    ::_exit(0);
  }
  round_trips(state, *shared, spin);
  int status = 0;
  ::waitpid(partner, &status, 0);
  ::munmap(memory, 4096);
}
BENCHMARK(BM_RoundTripProcesses)->Arg(0)->Arg(20)->Arg(50)->Arg(200)->Arg(-1)->UseRealTime();

// What a notify costs when nobody sleeps (the common case with spinning).
void BM_NotifyWithoutSleepers(benchmark::State& state) {
  EventCount event{};
  for (auto _ : state) event.notify_all();
}
BENCHMARK(BM_NotifyWithoutSleepers);

// The raw FUTEX_WAKE system call with nobody to wake.
void BM_FutexWakeSyscall(benchmark::State& state) {
  SharedWord32 word{0};
  for (auto _ : state) benchmark::DoNotOptimize(futex_wake_all(word));
}
BENCHMARK(BM_FutexWakeSyscall);

}  // namespace
}  // namespace tensorxfer::sync
