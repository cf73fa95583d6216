// ctest-labels: concurrent
// The pipeline executor with threads as ranks over in-process double buffers.
// Under TSan a slot rewritten before its reader finished is a reported race;
// without it the byte-exact checks after many delayed iterations catch it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/pipeline_executor.h"
#include "thread_buffers.h"

namespace tensorxfer::resharding {
namespace {

using namespace std::chrono_literals;

using testing::ThreadBuffers;
using testing::ThreadFabric;

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
          executor.execute_pipeline(mine, data.sends, data.receives, static_cast<uint64_t>(round) + 1);
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
  ThreadFabric fabric(2, 1024);
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
  EXPECT_THROW(executor.execute_pipeline(plan, sends, {}, 1), InvalidArgument);
  batch.segments = {TaskSegment{8, 0, 10, 0}};  // a task this rank does not send
  plan[0].send = batch;
  EXPECT_THROW(executor.execute_pipeline(plan, sends, {}, 1), InvalidArgument);
}

// One rank of a group of `world` with a 100-byte send task 7 and receive task 9.
struct OneRank {
  explicit OneRank(int world) : fabric(world, 1024), buffers(fabric, 0, 1), executor(engine, buffers, 0) {}
  ThreadFabric fabric;
  ThreadBuffers buffers;
  copy::CopyEngine engine{1};
  PipelineExecutor executor;
  std::vector<std::byte> source = std::vector<std::byte>(100), target = std::vector<std::byte>(100);
  TaskMemoryMap sends{{7, TaskMemory{source.data(), 100}}};
  TaskMemoryMap receives{{9, TaskMemory{target.data(), 100}}};

  static ScheduledBatch batch(int32_t src, int32_t dest, uint64_t task, uint32_t iteration = 0) {
    ScheduledBatch b;
    b.src_rank = src;
    b.dest_rank = dest;
    b.iteration = iteration;
    b.segments = {TaskSegment{task, 0, 100, 0}};
    b.total_nbytes = 100;
    return b;
  }
  // The message of the InvalidArgument `plan` raises ("" if none).
  std::string refusal(const std::vector<IterationSchedule>& plan) {
    try {
      executor.execute_pipeline(plan, sends, receives, 1);
    } catch (const InvalidArgument& error) {
      return error.what();
    }
    return "";
  }
};

TEST(PipelineExecutorTest, RefusesRanksOutsideTheGroupNamingTheField) {
  OneRank one(1);
  std::vector<IterationSchedule> plan(1);
  plan[0].send = OneRank::batch(0, 5, 7);  // the SIGSEGV of issue 13: rank 5 of a group of 1
  EXPECT_NE(one.refusal(plan).find("dest_pe must be another rank of the group (0..0, not 0), got 5"),
            std::string::npos)
      << one.refusal(plan);
  plan[0].send = OneRank::batch(0, -1, 7);
  EXPECT_NE(one.refusal(plan).find("dest_pe"), std::string::npos);
  plan[0].send = OneRank::batch(0, 0, 7);  // to itself: self moves are not scheduled
  EXPECT_NE(one.refusal(plan).find("dest_pe"), std::string::npos);
  plan[0].send = OneRank::batch(3, 0, 7);
  EXPECT_NE(one.refusal(plan).find("src_pe is 3, this is rank 0"), std::string::npos);
  plan[0].send.reset();
  plan[0].receive = OneRank::batch(2, 0, 9);
  EXPECT_NE(one.refusal(plan).find("src_pe must be another rank"), std::string::npos);
  EXPECT_EQ(one.target, std::vector<std::byte>(100));
}

TEST(PipelineExecutorTest, RefusesIterationBatchIndexSizesAndOverlapsBeforeAnythingMoves) {
  OneRank one(2);
  for (auto& byte : one.source) byte = std::byte{0x5A};
  std::vector<IterationSchedule> plan(2);
  plan[0].send = OneRank::batch(0, 1, 7, /*iteration=*/1);
  EXPECT_NE(one.refusal(plan).find("iteration is 1, expected 0"), std::string::npos);
  plan[0].send = OneRank::batch(0, 1, 7, 0);
  plan[1].send = OneRank::batch(0, 1, 7, 1);  // batch_index 0 twice for rank 1
  EXPECT_NE(one.refusal(plan).find("batch_index 0 appears twice"), std::string::npos);
  plan[1].send.reset();
  plan[0].send->total_nbytes = 4096;  // the slot holds 1024
  EXPECT_NE(one.refusal(plan).find("total_size 4096 exceeds the slot's 1024 bytes"), std::string::npos);
  plan[0].send = OneRank::batch(0, 1, 7, 0);
  plan[0].send->segments = {TaskSegment{7, 0, 60, 0}, TaskSegment{7, 60, 40, 32}};
  plan[0].send->total_nbytes = 100;
  EXPECT_NE(one.refusal(plan).find("segments overlap in the slot"), std::string::npos);
  plan[0].send->segments = {TaskSegment{7, 0, 50, 90}};
  EXPECT_NE(one.refusal(plan).find("slot_offset 90 + size 50 exceeds the batch's total_size 100"),
            std::string::npos);
  // Nothing was packed: every refusal came before the first copy (batches go to the peer's receive slot).
  EXPECT_EQ(std::memcmp(one.fabric.slot(1, 1, 0), std::vector<std::byte>(100).data(), 100), 0);
  EXPECT_EQ(std::memcmp(one.fabric.slot(0, 0, 0), std::vector<std::byte>(100).data(), 100), 0);
}

TEST(PipelineExecutorTest, RefusesToRunOnReleasedBuffers) {
  OneRank one(2);
  one.buffers.open = false;
  std::vector<IterationSchedule> plan(1);
  plan[0].send = OneRank::batch(0, 1, 7);
  EXPECT_THROW(one.executor.execute_pipeline(plan, one.sends, one.receives, 1), Closed);
  EXPECT_THROW(one.executor.launch_pack(0, *plan[0].send, one.sends), Closed);
}

TEST(PipelineExecutorTest, ABarrierThatTimesOutEndsTheRunWithTheError) {
  ThreadFabric fabric(2, 1024);  // rank 1 never comes
  ThreadBuffers buffers(fabric, 0, 1);
  copy::CopyEngine engine(1);
  buffers.timeout = 200ms;
  PipelineExecutor executor(engine, buffers, 0);
  std::vector<IterationSchedule> plan(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(executor.execute_pipeline(plan, {}, {}, 1), Timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// Two ranks run one-iteration plans (rank 0 sends task 7 to rank 1) tagged as
// given; returns each rank's error message ("" if it returned).
std::vector<std::string> run_tagged(uint64_t operation0, uint64_t operation1, uint32_t iterations1 = 1) {
  ThreadFabric fabric(2, 1024);
  copy::CopyEngine engine(1);
  std::vector<std::byte> source(100, std::byte{0x42}), target(100);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      ThreadBuffers buffers(fabric, rank, static_cast<unsigned>(rank + 1));
      buffers.timeout = 2000ms;
      PipelineExecutor executor(engine, buffers, rank);
      std::vector<IterationSchedule> plan(rank == 0 ? 1 : iterations1);
      TaskMemoryMap sends, receives;
      if (rank == 0) {
        plan[0].send = OneRank::batch(0, 1, 7);
        sends[7] = TaskMemory{source.data(), 100};
      } else {
        plan[0].receive = OneRank::batch(0, 1, 7);
        receives[7] = TaskMemory{target.data(), 100};
      }
      try {
        executor.execute_pipeline(plan, sends, receives, rank == 0 ? operation0 : operation1);
      } catch (const Error& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

TEST(PipelineExecutorTest, BarriersCarryTheOperationTheyBelongTo) {
  EXPECT_EQ(run_tagged(3, 3), (std::vector<std::string>{"", ""}));
  // A barrier of one operation never completes another's: both ranks raise at the first one.
  const auto crossed = run_tagged(3, 4);
  EXPECT_EQ(crossed[0], "PipelineExecutor: ranks out of step: rank 0 left barrier 0 of 2 of operation 3, which "
                        "rank 1 entered as barrier 0 of 2 of operation 4");
  EXPECT_NE(crossed[1].find("ranks out of step: rank 1 left barrier 0 of 2 of operation 4"), std::string::npos)
      << crossed[1];
  // Nor does a barrier of a plan with another number of iterations.
  const auto longer = run_tagged(3, 3, 2);
  EXPECT_NE(longer[0].find("which rank 1 entered as barrier 0 of 3 of operation 3"), std::string::npos) << longer[0];
  EXPECT_NE(longer[1].find("ranks out of step"), std::string::npos) << longer[1];
}

}  // namespace
}  // namespace tensorxfer::resharding
