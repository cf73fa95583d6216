// ctest-labels: concurrent
#include "tensorxfer/copy/copy_engine.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::copy {
namespace {

using namespace std::chrono_literals;

// A byte pattern that differs at every position of any realistic copy.
std::vector<uint8_t> pattern(std::size_t nbytes, uint32_t seed) {
  std::vector<uint8_t> bytes(nbytes);
  uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<uint8_t>(state >> 24);
  }
  return bytes;
}

struct EngineShape {
  std::size_t num_threads;
  std::size_t max_parallelism;
};

class CopyEngineSizesTest : public ::testing::TestWithParam<EngineShape> {};

// Copies from and to misaligned addresses, checking the guard bytes around dst.
TEST_P(CopyEngineSizesTest, CopiesEverySizeExactly) {
  CopyEngineOptions options;
  options.num_threads = GetParam().num_threads;
  options.max_parallelism = GetParam().max_parallelism;
  CopyEngine engine(options);
  const std::size_t sizes[] = {0,           1,           7,           63,          64,
                               65,          4095,        (1u << 20) - 1, 1u << 20, (1u << 20) + 13,
                               (3u << 20) + 4097, (9u << 20) + 5};
  constexpr std::size_t kGuard = 64;
  for (std::size_t nbytes : sizes) {
    for (std::size_t misalign : {std::size_t{0}, std::size_t{3}}) {
      SCOPED_TRACE("nbytes=" + std::to_string(nbytes) + " misalign=" + std::to_string(misalign));
      const auto source = pattern(nbytes + misalign, static_cast<uint32_t>(nbytes));
      std::vector<uint8_t> target(nbytes + 2 * kGuard + misalign, 0xA5);
      engine.copy(target.data() + kGuard + misalign, source.data() + misalign, nbytes);
      EXPECT_TRUE(std::equal(source.begin() + misalign, source.end(), target.begin() + kGuard + misalign));
      for (std::size_t i = 0; i < kGuard + misalign; ++i) ASSERT_EQ(target[i], 0xA5) << i;
      for (std::size_t i = kGuard + misalign + nbytes; i < target.size(); ++i) ASSERT_EQ(target[i], 0xA5) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CopyEngineSizesTest,
                         ::testing::Values(EngineShape{1, 0}, EngineShape{2, 0}, EngineShape{4, 5},
                                           EngineShape{3, 1}));

TEST(CopyEngineTest, HugeCopyIsExact) {
  CopyEngine engine(2);
  const std::size_t nbytes = (std::size_t{96} << 20) + 11;
  std::vector<uint8_t> source(nbytes);
  for (std::size_t i = 0; i < nbytes; ++i) source[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  std::vector<uint8_t> target(nbytes, 0);
  engine.copy(target.data(), source.data(), nbytes);
  EXPECT_TRUE(target == source);
}

TEST(CopyEngineTest, DefaultsFollowTheHardware) {
  CopyEngine engine;
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(engine.max_parallelism(), std::clamp<std::size_t>(cores, 2, kMaxDefaultParallelism));
  // The caller is one of the threads of every job: one worker fewer.
  EXPECT_EQ(engine.num_threads(), engine.max_parallelism() - 1);
  EXPECT_LE(engine.num_threads(), kMaxDefaultParallelism - 1) << "bounded however many cores there are";
}

TEST(CopyEngineTest, ParallelForVisitsEveryIndexOnce) {
  CopyEngine engine(3);
  for (std::size_t count : {0, 1, 5, 64, 1000, 4097}) {
    for (std::size_t grain : {1, 7, 64, 5000}) {
      std::vector<std::atomic<int>> visits(count);
      engine.parallel_for(count, grain, [&](std::size_t begin, std::size_t end) {
        ASSERT_LT(begin, end);
        ASSERT_LE(end, count);
        ASSERT_LE(end - begin, grain);
        for (std::size_t i = begin; i < end; ++i) visits[i].fetch_add(1);
      });
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(visits[i].load(), 1) << "count=" << count << " grain=" << grain << " i=" << i;
    }
  }
}

// The caller holds its first range until a worker has thrown, so the error
// surely comes from another thread.
TEST(CopyEngineTest, WorkerExceptionIsRethrownOnTheCaller) {
  CopyEngine engine(2);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> worker_threw{false};
  try {
    engine.parallel_for(64, 1, [&](std::size_t, std::size_t) {
      if (std::this_thread::get_id() == caller) {
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        while (!worker_threw.load() && std::chrono::steady_clock::now() < give_up) {
          std::this_thread::sleep_for(100us);
        }
        return;
      }
      worker_threw.store(true);
      throw InvalidArgument("range failed on a worker");
    });
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "range failed on a worker");
  }
  EXPECT_TRUE(worker_threw.load());
  // Still usable afterwards.
  std::atomic<std::size_t> total{0};
  engine.parallel_for(100, 3, [&](std::size_t b, std::size_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 100u);
}

TEST(CopyEngineTest, CallerExceptionStopsHandingOutRanges) {
  CopyEngine engine(1);
  std::atomic<std::size_t> ran{0};
  // Each range busies its thread for 10 us, so even if the throwing thread is
  // preempted for a while the other cannot finish all 100000 ranges (1 s) first.
  EXPECT_THROW(engine.parallel_for(100000, 1,
                                   [&](std::size_t begin, std::size_t) {
                                     ran.fetch_add(1);
                                     if (begin == 0) throw std::runtime_error("first range fails");
                                     const auto until = std::chrono::steady_clock::now() +
                                                        std::chrono::microseconds(10);
                                     while (std::chrono::steady_clock::now() < until) {
                                     }
                                   }),
               std::runtime_error);
  EXPECT_LT(ran.load(), 100000u);
}

TEST(CopyEngineTest, NestedCallsRunInline) {
  CopyEngine engine(2);
  std::vector<uint8_t> source = pattern(2 << 20, 9);
  std::vector<std::vector<uint8_t>> targets(4, std::vector<uint8_t>(source.size()));
  engine.parallel_for(targets.size(), 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      engine.copy(targets[i].data(), source.data(), source.size());
      std::atomic<int> inner{0};
      engine.parallel_for(10, 2, [&](std::size_t b, std::size_t e) { inner += static_cast<int>(e - b); });
      ASSERT_EQ(inner.load(), 10);
    }
  });
  for (const auto& target : targets) EXPECT_TRUE(target == source);
}

TEST(CopyEngineTest, ConcurrentCallersTakeTurns) {
  CopyEngine engine(2);
  constexpr int kCallers = 4;
  std::vector<std::vector<uint8_t>> sources, targets;
  for (int i = 0; i < kCallers; ++i) {
    sources.push_back(pattern((3 << 20) + i, i));
    targets.emplace_back(sources.back().size());
  }
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int round = 0; round < 5; ++round) {
        std::fill(targets[i].begin(), targets[i].end(), 0);
        engine.copy(targets[i].data(), sources[i].data(), sources[i].size());
        ASSERT_TRUE(targets[i] == sources[i]);
      }
    });
  }
  for (auto& caller : callers) caller.join();
}

TEST(CopyEngineTest, DestructorJoinsIdleAndJustUsedWorkers) {
  for (int i = 0; i < 50; ++i) {
    CopyEngineOptions options;
    options.num_threads = 3;
    options.spin = std::chrono::microseconds(i % 2 ? 0 : 500);
    CopyEngine engine(options);
    if (i % 3 == 0) {
      std::atomic<int> total{0};
      engine.parallel_for(16, 1, [&](std::size_t, std::size_t) { total++; });
      ASSERT_EQ(total.load(), 16);
    }
  }
}

// Runs a job whose ranges on the calling thread wait (up to 10 s) until a
// worker has taken one; true if a worker did.
bool a_worker_joins_a_job(CopyEngine& engine) {
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> worker_ran{false};
  engine.parallel_for(8, 1, [&](std::size_t, std::size_t) {
    if (std::this_thread::get_id() != caller) {
      worker_ran = true;
      return;
    }
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!worker_ran.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(50us);
  });
  return worker_ran.load();
}

TEST(CopyEngineTest, SleepingWorkersWakeForNewJobs) {
  CopyEngineOptions options;
  options.num_threads = 2;
  options.spin = std::chrono::microseconds(0);
  CopyEngine engine(options);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(5ms);  // every worker is asleep now
    EXPECT_TRUE(a_worker_joins_a_job(engine)) << "round " << round;
  }
}

// CPU time (ns) every thread of this process but the calling one has used so
// far, from each thread's CPU clock (Linux: clock id ~tid << 3 | CPUCLOCK_SCHED
// | CPUCLOCK_PERTHREAD, what pthread_getcpuclockid returns).
int64_t other_threads_cpu_ns() {
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  int64_t total = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (tid <= 0 || tid == self) continue;
    const clockid_t clock = static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
    timespec used{};
    if (::clock_gettime(clock, &used) == 0) total += int64_t{used.tv_sec} * 1000000000 + used.tv_nsec;
  }
  ::closedir(tasks);
  return total;
}

TEST(CopyEngineTest, IdleWorkersUseNoCpuBetweenJobs) {
  // N collector processes each own an engine: workers that poll after a job
  // would take CPU from the learner on the same machine. Defaults as users get them.
  CopyEngine engine;
  ASSERT_GE(other_threads_cpu_ns(), 0);
  const auto caller = std::this_thread::get_id();
  constexpr int kRounds = 20;
  int64_t idle_ns = 0;
  for (int round = 0; round < kRounds; ++round) {
    // A job every worker takes part in: the caller's ranges wait for them.
    std::atomic<std::size_t> worker_ranges{0};
    engine.parallel_for(2 * engine.max_parallelism(), 1, [&](std::size_t, std::size_t) {
      if (std::this_thread::get_id() != caller) {
        worker_ranges++;
        return;
      }
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (worker_ranges.load() == 0 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(50us);
      }
    });
    ASSERT_GT(worker_ranges.load(), 0u) << "round " << round;
    const int64_t before = other_threads_cpu_ns();
    std::this_thread::sleep_for(10ms);
    idle_ns += other_threads_cpu_ns() - before;
  }
  // A worker going back to sleep costs microseconds; polling for 200 us after
  // each job costs 200 us per round per worker. So the budget is per worker:
  // 16 workers (a 16-core machine) each took 1.5 us a round to go back to sleep.
  const int64_t workers = static_cast<int64_t>(engine.max_parallelism());
  std::fprintf(stderr, "idle worker CPU: %lld us over %d rounds, %lld workers\n",
               static_cast<long long>(idle_ns / 1000), kRounds, static_cast<long long>(workers));
  EXPECT_LT(idle_ns, int64_t{kRounds} * workers * 10000)
      << "worker threads used " << idle_ns / 1000 << " us of CPU in " << kRounds << " idle gaps of 10 ms";
  const int64_t before = other_threads_cpu_ns();
  std::this_thread::sleep_for(200ms);
  EXPECT_LT(other_threads_cpu_ns() - before, 200000) << "CPU used by idle workers in 200 ms";
}

TEST(CopyEngineTest, WorkersPollAfterBackToBackJobsThenSleep) {
  CopyEngineOptions options;
  options.num_threads = 1;
  options.idle_spin = std::chrono::microseconds(50000);  // long enough to see on the CPU clock
  CopyEngine engine(options);
  auto job_with_the_worker = [&] { return a_worker_joins_a_job(engine); };
  // Jobs far apart: the worker sleeps between them.
  ASSERT_TRUE(job_with_the_worker());
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(job_with_the_worker());
  int64_t before = other_threads_cpu_ns();
  std::this_thread::sleep_for(20ms);
  const int64_t after_a_lone_job = other_threads_cpu_ns() - before;
  EXPECT_LT(after_a_lone_job, 2000000) << "CPU used in 20 ms after a job that came 100 ms after the last";
  // Jobs back to back: the worker polls for the next one (50 ms) ...
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(job_with_the_worker()) << "job " << i;
  before = other_threads_cpu_ns();
  std::this_thread::sleep_for(20ms);
  const int64_t after_back_to_back = other_threads_cpu_ns() - before;
  EXPECT_GT(after_back_to_back, 2000000) << "CPU used in 20 ms after back-to-back jobs";
  // ... and then sleeps.
  std::this_thread::sleep_for(100ms);
  before = other_threads_cpu_ns();
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(other_threads_cpu_ns() - before, 2000000) << "CPU used in 100 ms once the poll ran out";
}

TEST(RequireCopyableTest, RefusesMismatchedViewsNamingThem) {
  std::vector<float> a(16), b(8);
  TensorView dst = TensorView::bytes(a.data(), 64);
  TensorView src = TensorView::bytes(b.data(), 32);
  try {
    require_copyable(dst, src);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("dst 64 bytes"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("src 32 bytes"), std::string::npos) << error.what();
  }
  TensorView readonly = TensorView::bytes(b.data(), 32);
  readonly.readonly = true;
  EXPECT_THROW(require_copyable(readonly, TensorView::bytes(a.data(), 32)), InvalidArgument);
  TensorView strided = TensorView::bytes(a.data(), 8);
  strided.strides = {2};
  EXPECT_THROW(require_copyable(strided, TensorView::bytes(b.data(), 8)), InvalidArgument);
  TensorView device = TensorView::bytes(a.data(), 8, DLDevice{kDLCUDA, 0});
  EXPECT_THROW(require_copyable(TensorView::bytes(b.data(), 8), device), InvalidArgument);
  // Partial overlap is refused, identical ranges are a no-op copy.
  EXPECT_THROW(require_copyable(TensorView::bytes(a.data(), 32), TensorView::bytes(a.data() + 1, 32)),
               InvalidArgument);
  EXPECT_NO_THROW(require_copyable(TensorView::bytes(a.data(), 32), TensorView::bytes(a.data(), 32)));
}

#if !defined(__SANITIZE_THREAD__)
// A forked child has none of the workers: its copies run inline and its
// engine's destructor must not try to join the parent's threads.
TEST(CopyEngineTest, WorksInAForkedChild) {
  auto engine = std::make_unique<CopyEngine>(2);
  const auto source = pattern(4 << 20, 3);
  std::vector<uint8_t> target(source.size());
  engine->copy(target.data(), source.data(), source.size());  // workers are running now
  const pid_t child = testing::fork_child([&] {
    std::vector<uint8_t> again(source.size());
    engine->copy(again.data(), source.data(), source.size());
    std::atomic<int> total{0};
    engine->parallel_for(100, 1, [&](std::size_t b, std::size_t e) { total += static_cast<int>(e - b); });
    engine.reset();  // must not join (or hang on) the parent's workers
    return again == source && total.load() == 100 ? 0 : 1;
  });
  ASSERT_GE(child, 0);
  EXPECT_EQ(testing::wait_exit_code(child), 0);
}
#endif

}  // namespace
}  // namespace tensorxfer::copy
