// The pipeline executor with threads as ranks over in-process double buffers.
// Under TSan a slot rewritten before its reader finished is a reported race;
// without it the byte-exact checks after many delayed iterations catch it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/pipeline_executor.h"

namespace tensorxfer::resharding {
namespace {

using namespace std::chrono_literals;

// Every rank's four slots plus a generation barrier, shared by the threads.
class ThreadFabric {
 public:
  ThreadFabric(int world_size, std::size_t slot_nbytes)
      : world_size_(world_size), slot_nbytes_(slot_nbytes),
        slots_(static_cast<std::size_t>(world_size) * 4, std::vector<std::byte>(slot_nbytes)) {}

  std::byte* slot(int rank, int kind, int index) {  // kind 0: send, 1: receive
    return slots_[static_cast<std::size_t>(rank * 4 + kind * 2 + index)].data();
  }
  std::size_t slot_nbytes() const { return slot_nbytes_; }

  void barrier(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, timeout, [&] { return generation_ != generation; })) {
      throw Timeout("barrier timed out");
    }
  }

 private:
  int world_size_;
  std::size_t slot_nbytes_;
  std::vector<std::vector<std::byte>> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ThreadBuffers final : public DoubleBuffers {
 public:
  ThreadBuffers(ThreadFabric& fabric, int rank, unsigned delay_seed)
      : fabric_(fabric), rank_(rank), random_(delay_seed) {}
  // Sleep a random 0-300 us before each barrier, so ranks drift apart.
  bool delays = false;
  std::chrono::milliseconds timeout{10000};
  std::size_t slot_nbytes() const noexcept override { return fabric_.slot_nbytes(); }
  std::byte* send_slot(int index) noexcept override { return fabric_.slot(rank_, 0, index); }
  std::byte* receive_slot(int index) noexcept override { return fabric_.slot(rank_, 1, index); }
  std::byte* peer_receive_slot(int pe, int index) noexcept override { return fabric_.slot(pe, 1, index); }
  void barrier() override {
    if (delays) std::this_thread::sleep_for(std::chrono::microseconds(random_() % 300));
    fabric_.barrier(timeout);
  }

 private:
  ThreadFabric& fabric_;
  int rank_;
  std::minstd_rand random_;
};

struct RankData {
  std::vector<std::vector<std::byte>> sources;       // by local send index
  std::vector<std::vector<std::byte>> destinations;  // by local receive index
  TaskMemoryMap sends, receives;
};

std::byte expected_byte(uint64_t task_id, uint64_t offset, int round) {
  return static_cast<std::byte>((task_id * 131 + offset * 7 + static_cast<uint64_t>(round) * 29) & 0xFF);
}

// Runs `rounds` transfers of a random all-to-all workload and checks every byte.
void run_ranks(int world_size, int rounds, bool delays, std::size_t slot_nbytes) {
  std::mt19937_64 random(world_size * 1000 + rounds);
  std::vector<TaskEndpoint> tasks;
  for (uint64_t id = 0; id < 120; ++id) {
    const uint64_t nbytes = random() % 4 == 0 ? 1 + random() % (3 * slot_nbytes) : 1 + random() % 3000;
    tasks.push_back(TaskEndpoint{id, nbytes, static_cast<int32_t>(random() % world_size),
                                 static_cast<int32_t>(random() % world_size)});
  }
  const Schedule schedule = build_schedule(tasks, tasks, world_size, BatchLimits{slot_nbytes, 16});

  ThreadFabric fabric(world_size, slot_nbytes);
  copy::CopyEngine engine(1);
  std::vector<std::string> failures(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ThreadBuffers buffers(fabric, rank, static_cast<unsigned>(rank + 1));
        buffers.delays = delays;
        PipelineExecutor executor(engine, buffers, rank);
        RankData data;
        for (const TaskEndpoint& task : tasks) {
          if (task.src_rank == rank && task.dest_rank != rank) {
            data.sources.emplace_back(task.nbytes);
            data.sends[task.task_id] = TaskMemory{data.sources.back().data(), task.nbytes};
          }
          if (task.dest_rank == rank && task.src_rank != rank) {
            data.destinations.emplace_back(task.nbytes);
            data.receives[task.task_id] = TaskMemory{data.destinations.back().data(), task.nbytes};
          }
        }
        std::vector<IterationSchedule> mine(schedule.num_iterations);
        for (const ScheduledBatch& batch : schedule.batches) {
          if (batch.src_rank == rank) mine[batch.iteration].send = batch;
          if (batch.dest_rank == rank) mine[batch.iteration].receive = batch;
        }
        for (int round = 0; round < rounds; ++round) {
          for (auto& [id, memory] : data.sends) {
            for (uint64_t i = 0; i < memory.nbytes; ++i) memory.data[i] = expected_byte(id, i, round);
          }
          executor.execute_pipeline(mine, data.sends, data.receives);
          for (auto& [id, memory] : data.receives) {
            for (uint64_t i = 0; i < memory.nbytes; ++i) {
              if (memory.data[i] != expected_byte(id, i, round)) {
                failures[static_cast<std::size_t>(rank)] =
                    "round " + std::to_string(round) + " task " + std::to_string(id) + " byte " + std::to_string(i) + " got " + std::to_string(static_cast<int>(memory.data[i])) + " expected " + std::to_string(static_cast<int>(expected_byte(id, i, round)));
                return;
              }
            }
          }
        }
      } catch (const std::exception& error) {
        failures[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world_size; ++rank) EXPECT_EQ(failures[static_cast<std::size_t>(rank)], "") << "rank " << rank;
}

TEST(PipelineExecutorTest, MovesEveryByteBetweenTwoRanks) { run_ranks(2, 3, false, 8192); }

TEST(PipelineExecutorTest, MovesEveryByteBetweenFourRanksWithDelays) { run_ranks(4, 4, true, 4096); }

TEST(PipelineExecutorTest, RepeatedRunsWithInjectedDelaysNeverOverwriteAnUnreadSlot) {
  run_ranks(3, 12, true, 2048);
}

TEST(PipelineExecutorTest, RefusesASegmentOutsideItsTask) {
  ThreadFabric fabric(1, 1024);
  ThreadBuffers buffers(fabric, 0, 1);
  copy::CopyEngine engine(1);
  PipelineExecutor executor(engine, buffers, 0);
  std::vector<std::byte> source(100);
  TaskMemoryMap sends{{7, TaskMemory{source.data(), 100}}};
  ScheduledBatch batch;
  batch.src_rank = 0;
  batch.dest_rank = 1;
  batch.segments = {TaskSegment{7, 50, 80, 0}};  // bytes 50..130 of a 100-byte task
  batch.total_nbytes = 80;
  std::vector<IterationSchedule> plan(1);
  plan[0].send = batch;
  EXPECT_THROW(executor.execute_pipeline(plan, sends, {}), InvalidArgument);
  batch.segments = {TaskSegment{8, 0, 10, 0}};  // a task this rank does not send
  plan[0].send = batch;
  EXPECT_THROW(executor.execute_pipeline(plan, sends, {}), InvalidArgument);
}

TEST(PipelineExecutorTest, ABarrierThatTimesOutEndsTheRunWithTheError) {
  ThreadFabric fabric(2, 1024);  // rank 1 never comes
  ThreadBuffers buffers(fabric, 0, 1);
  copy::CopyEngine engine(1);
  buffers.timeout = 200ms;
  PipelineExecutor executor(engine, buffers, 0);
  std::vector<IterationSchedule> plan(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(executor.execute_pipeline(plan, {}, {}), Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace tensorxfer::resharding
