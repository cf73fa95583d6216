#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "tensorxfer/common/error.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/task_matcher.h"
#include "tensorxfer/resharding/workload_packer.h"

namespace tensorxfer::resharding {
namespace {

TaskEndpoint endpoint(uint64_t task_id, uint64_t nbytes, int src, int dest) {
  return TaskEndpoint{task_id, nbytes, src, dest};
}

std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "no error";
}

TEST(TaskMatcherTest, PairsSendsWithReceivesSortedByTaskId) {
  const auto tasks = match_tasks({endpoint(7, 10, 0, 1), endpoint(3, 20, 1, 0)},
                                 {endpoint(3, 20, 1, 0), endpoint(7, 10, 0, 1)}, 2);
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].task_id, 3u);
  EXPECT_EQ(tasks[0].src_rank, 1);
  EXPECT_EQ(tasks[1].task_id, 7u);
  EXPECT_EQ(tasks[1].nbytes, 10u);
}

TEST(TaskMatcherTest, EveryMismatchIsRefusedNamingTheTask) {
  EXPECT_EQ(message_of([] { match_tasks({}, {endpoint(5, 8, 0, 1)}, 2); }),
            "missing send for task_id=5 (rank 1 receives it from rank 0)");
  EXPECT_EQ(message_of([] { match_tasks({endpoint(6, 8, 0, 1)}, {}, 2); }),
            "missing receive for task_id=6 (rank 0 sends it to rank 1)");
  EXPECT_EQ(message_of([] { match_tasks({endpoint(4, 8, 0, 1)}, {endpoint(4, 16, 0, 1)}, 2); }),
            "task_id=4: rank 0 sends 8 bytes but rank 1 receives 16 bytes");
  EXPECT_EQ(message_of([] { match_tasks({endpoint(4, 8, 0, 1)}, {endpoint(4, 8, 0, 2)}, 3); }),
            "task_id=4: the send goes rank 0 -> 1 but the receive expects rank 0 -> 2");
  EXPECT_EQ(message_of([] { match_tasks({endpoint(2, 8, 0, 1), endpoint(2, 8, 1, 0)}, {}, 2); }),
            "task_id=2 has two sends (rank 0 -> 1 and rank 1 -> 0)");
  EXPECT_EQ(message_of([] { match_tasks({endpoint(2, 8, 0, 5)}, {endpoint(2, 8, 0, 5)}, 2); }),
            "send of task_id=2 names ranks 0 -> 5, expected ranks in [0, 2)");
  EXPECT_NE(message_of([] { match_tasks({}, {}, 0); }), "no error");
}

TEST(WorkloadPackerTest, TasksLargerThanASlotAreCutIntoSlotSizedSegments) {
  const BatchLimits limits{1024, 16};
  const auto segments = segment_tasks({MatchedTask{1, 2600, 0, 1}, MatchedTask{2, 0, 0, 1}, MatchedTask{3, 99, 1, 1}},
                                      limits);
  ASSERT_EQ(segments.size(), 3u);  // the 0-byte and the same-rank task move nothing here
  EXPECT_EQ(segments[0].second.nbytes, 1024u);
  EXPECT_EQ(segments[1].second.task_offset, 1024u);
  EXPECT_EQ(segments[2].second.task_offset, 2048u);
  EXPECT_EQ(segments[2].second.nbytes, 552u);
}

TEST(WorkloadPackerTest, RefusesLimitsThatCannotHoldASegment) {
  EXPECT_THROW(segment_tasks({}, BatchLimits{100, 4}), InvalidArgument);  // not a multiple of 64
  EXPECT_THROW(segment_tasks({}, BatchLimits{0, 4}), InvalidArgument);
  EXPECT_THROW(segment_tasks({}, BatchLimits{1024, 0}), InvalidArgument);
}

TEST(WorkloadPackerTest, BestFitDecreasingFillsSlotsAndRespectsTheTaskCount) {
  // Invariants of any valid packing: every batch fits its slot and its task
  // count, segments are aligned and disjoint, every byte of every task is kept.
  std::vector<MatchedTask> tasks;
  for (uint64_t id = 0; id < 50; ++id) tasks.push_back(MatchedTask{id, 37 + id * 41 % 900, 0, 1});
  const BatchLimits limits{1024, 3};
  const auto batches = pack_segments(segment_tasks(tasks, limits), limits);
  uint64_t moved = 0;
  std::set<uint64_t> seen;
  for (const ScheduledBatch& batch : batches) {
    ASSERT_LE(batch.segments.size(), 3u);
    ASSERT_LE(batch.total_nbytes, limits.slot_nbytes);
    uint64_t end = 0;
    for (const TaskSegment& segment : batch.segments) {
      EXPECT_EQ(segment.slot_offset % kSegmentAlignment, 0u);
      EXPECT_GE(segment.slot_offset, end);  // no overlap, laid out in order
      end = segment.slot_offset + segment.nbytes;
      moved += segment.nbytes;
      EXPECT_TRUE(seen.insert(segment.task_id).second);
    }
    EXPECT_EQ(batch.total_nbytes, end);
  }
  uint64_t expected = 0;
  for (const MatchedTask& task : tasks) expected += task.nbytes;
  EXPECT_EQ(moved, expected);
  EXPECT_EQ(seen.size(), tasks.size());
}

TEST(WorkloadPackerTest, SmallSegmentsShareOneBatch) {
  std::vector<MatchedTask> tasks;
  for (uint64_t id = 0; id < 1000; ++id) tasks.push_back(MatchedTask{id, 4096, 0, 1});
  const BatchLimits limits{uint64_t{4} << 20, 10000};
  const auto batches = pack_segments(segment_tasks(tasks, limits), limits);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].segments.size(), 1000u);
  EXPECT_EQ(batches[0].total_nbytes, 1000u * 4096u);
}

// Every byte of every remote task is covered exactly once, and no rank sends
// or receives twice in one iteration.
void expect_valid(const Schedule& schedule, const std::vector<MatchedTask>& tasks, const BatchLimits& limits) {
  std::map<uint64_t, uint64_t> covered;
  std::set<std::pair<uint32_t, int32_t>> senders, receivers;
  for (const ScheduledBatch& batch : schedule.batches) {
    ASSERT_LT(batch.iteration, schedule.num_iterations);
    EXPECT_TRUE(senders.insert({batch.iteration, batch.src_rank}).second) << "rank sends twice in an iteration";
    EXPECT_TRUE(receivers.insert({batch.iteration, batch.dest_rank}).second) << "rank receives twice";
    ASSERT_LE(batch.total_nbytes, limits.slot_nbytes);
    for (const TaskSegment& segment : batch.segments) covered[segment.task_id] += segment.nbytes;
  }
  for (const MatchedTask& task : tasks) {
    if (task.src_rank == task.dest_rank || task.nbytes == 0) {
      EXPECT_EQ(covered.count(task.task_id), 0u);
    } else {
      EXPECT_EQ(covered[task.task_id], task.nbytes) << "task " << task.task_id;
    }
  }
}

void expect_same_schedule(const Schedule& again, const Schedule& schedule) {
  ASSERT_EQ(again.num_iterations, schedule.num_iterations);
  ASSERT_EQ(again.batches.size(), schedule.batches.size());
  for (std::size_t i = 0; i < schedule.batches.size(); ++i) {
    const ScheduledBatch& a = schedule.batches[i];
    const ScheduledBatch& b = again.batches[i];
    ASSERT_EQ(std::tie(a.src_rank, a.dest_rank, a.batch_index, a.iteration, a.total_nbytes),
              std::tie(b.src_rank, b.dest_rank, b.batch_index, b.iteration, b.total_nbytes));
    ASSERT_EQ(a.segments.size(), b.segments.size());
    for (std::size_t s = 0; s < a.segments.size(); ++s) {
      EXPECT_EQ(std::tie(a.segments[s].task_id, a.segments[s].task_offset, a.segments[s].slot_offset),
                std::tie(b.segments[s].task_id, b.segments[s].task_offset, b.segments[s].slot_offset));
    }
  }
}

TEST(CommunicationSchedulerTest, RandomAllToAllIsValidAndDeterministic) {
  std::mt19937_64 random(42);
  for (int world_size : {1, 2, 3, 4, 8}) {
    std::vector<TaskEndpoint> sends;
    for (uint64_t id = 0; id < 400; ++id) {
      const int src = static_cast<int>(random() % world_size);
      const int dest = static_cast<int>(random() % world_size);
      const uint64_t nbytes = random() % 5 == 0 ? random() % (1 << 20) : random() % 8192;
      sends.push_back(endpoint(id * 7 + 3, nbytes, src, dest));
    }
    std::vector<TaskEndpoint> receives = sends;
    const BatchLimits limits{256 << 10, 64};
    const Schedule schedule = build_schedule(sends, receives, world_size, limits);
    expect_valid(schedule, match_tasks(sends, receives, world_size), limits);

    // Another rank sees the same all-gathered metadata in another order.
    std::shuffle(sends.begin(), sends.end(), random);
    std::shuffle(receives.begin(), receives.end(), random);
    expect_same_schedule(build_schedule(sends, receives, world_size, limits), schedule);
    // Tasks matched once (as the copy services match them) schedule the same way.
    expect_same_schedule(schedule_matched_tasks(match_tasks(sends, receives, world_size), world_size, limits),
                         schedule);
  }
}

TEST(CommunicationSchedulerTest, MatchedTasksMustBeInIdOrderAndInRange) {
  const BatchLimits limits{1024, 8};
  EXPECT_EQ(message_of([&] {
              schedule_matched_tasks({MatchedTask{5, 8, 0, 1}, MatchedTask{5, 8, 1, 0}}, 2, limits);
            }),
            "matched task_id=5 follows task_id=5, expected strictly increasing ids");
  EXPECT_EQ(message_of([&] { schedule_matched_tasks({MatchedTask{3, 8, 0, 2}}, 2, limits); }),
            "task_id=3 goes rank 0 -> 2, expected ranks in [0, 2)");
  const Schedule ok = schedule_matched_tasks({MatchedTask{1, 8, 0, 1}, MatchedTask{4, 8, 1, 1}}, 2, limits);
  ASSERT_EQ(ok.batches.size(), 1u);  // the same-rank task is not scheduled
  EXPECT_EQ(ok.batches[0].segments.at(0).task_id, 1u);
}

TEST(CommunicationSchedulerTest, ARingOfTransfersNeedsOneIterationPerBatch) {
  // 4 ranks each send one slot-sized batch to the next: all fit in iteration 0.
  std::vector<TaskEndpoint> sends;
  for (int rank = 0; rank < 4; ++rank) sends.push_back(endpoint(rank, 1024, rank, (rank + 1) % 4));
  const Schedule ring = build_schedule(sends, sends, 4, BatchLimits{1024, 8});
  EXPECT_EQ(ring.num_iterations, 1u);
  EXPECT_EQ(ring.batches.size(), 4u);
  // Two ranks sending to one: that receiver takes them in two iterations.
  const std::vector<TaskEndpoint> fan_in = {endpoint(1, 1024, 0, 2), endpoint(2, 1024, 1, 2)};
  EXPECT_EQ(build_schedule(fan_in, fan_in, 3, BatchLimits{1024, 8}).num_iterations, 2u);
}

TEST(CommunicationSchedulerTest, RefusesSameRankOrOutOfRangeBatches) {
  ScheduledBatch self_batch;
  self_batch.src_rank = self_batch.dest_rank = 1;
  EXPECT_THROW(schedule_batches({self_batch}, 2), InvalidArgument);
  ScheduledBatch far;
  far.src_rank = 0;
  far.dest_rank = 9;
  EXPECT_THROW(schedule_batches({far}, 2), InvalidArgument);
}

}  // namespace
}  // namespace tensorxfer::resharding
