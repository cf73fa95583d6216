// ctest-labels: concurrent
// Persistent plans: strided views as pieces, stream copies between two piece
// lists, and repeated runs of prepared copy lists with threads as ranks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/resharding/communication_scheduler.h"
#include "tensorxfer/resharding/persistent_plan.h"
#include "tensorxfer/resharding/pipeline_executor.h"
#include "thread_buffers.h"

namespace tensorxfer::resharding {
namespace {

using testing::ThreadBuffers;
using testing::ThreadFabric;

std::vector<std::pair<std::ptrdiff_t, uint64_t>> offsets(const Pieces& pieces, const std::byte* base) {
  std::vector<std::pair<std::ptrdiff_t, uint64_t>> out;
  for (const Piece& piece : pieces) out.emplace_back(piece.data - base, piece.nbytes);
  return out;
}

TEST(StridedPiecesTest, AContiguousViewIsOnePiece) {
  std::vector<std::byte> memory(96);
  const auto pieces = strided_pieces(memory.data(), 4, {4, 6}, {24, 4});
  EXPECT_EQ(offsets(pieces, memory.data()), (std::vector<std::pair<std::ptrdiff_t, uint64_t>>{{0, 96}}));
}

TEST(StridedPiecesTest, AColumnSliceIsOnePiecePerRow) {
  std::vector<std::byte> memory(4 * 8 * 2);  // (4, 8) bfloat16, columns 2..5
  const auto pieces = strided_pieces(memory.data() + 4, 2, {4, 4}, {16, 2});
  EXPECT_EQ(offsets(pieces, memory.data()),
            (std::vector<std::pair<std::ptrdiff_t, uint64_t>>{{4, 8}, {20, 8}, {36, 8}, {52, 8}}));
}

TEST(StridedPiecesTest, ATransposeIsOnePiecePerElementInRowMajorOrder) {
  std::vector<std::byte> memory(6 * 4);  // (2, 3) float32 seen as (3, 2)
  const auto pieces = strided_pieces(memory.data(), 4, {3, 2}, {4, 12});
  EXPECT_EQ(offsets(pieces, memory.data()),
            (std::vector<std::pair<std::ptrdiff_t, uint64_t>>{{0, 4}, {12, 4}, {4, 4}, {16, 4}, {8, 4}, {20, 4}}));
}

TEST(StridedPiecesTest, SizeOneDimensionsEmptyViewsAndScalars) {
  std::vector<std::byte> memory(64);
  EXPECT_EQ(offsets(strided_pieces(memory.data(), 8, {1, 4, 1}, {999, 8, 777}), memory.data()),
            (std::vector<std::pair<std::ptrdiff_t, uint64_t>>{{0, 32}}));
  EXPECT_TRUE(strided_pieces(memory.data(), 8, {3, 0}, {8, 8}).empty());
  EXPECT_EQ(pieces_nbytes(strided_pieces(memory.data(), 2, {}, {})), 2u);
  EXPECT_THROW(strided_pieces(memory.data(), 2, {3}, {}), InvalidArgument);
  EXPECT_THROW(strided_pieces(memory.data(), 2, {-1}, {2}), InvalidArgument);
}

TEST(StridedPiecesTest, ANegativeStrideWalksBackwards) {
  std::vector<std::byte> memory(12);
  const auto pieces = strided_pieces(memory.data() + 8, 4, {3}, {-4});
  EXPECT_EQ(offsets(pieces, memory.data()),
            (std::vector<std::pair<std::ptrdiff_t, uint64_t>>{{8, 4}, {4, 4}, {0, 4}}));
}

TEST(StreamCopyTest, CutsWhereEitherSideEndsAndMergesWhereBothContinue) {
  std::vector<std::byte> a(40), b(40);
  const Pieces src{{a.data(), 10}, {a.data() + 20, 20}};
  const Pieces dst{{b.data(), 15}, {b.data() + 15, 15}};  // adjacent: one run
  std::vector<copy::Span> spans;
  append_stream_copy(spans, src, 5, dst, 2, 20);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].src, a.data() + 5);
  EXPECT_EQ(spans[0].dst, b.data() + 2);
  EXPECT_EQ(spans[0].nbytes, 5u);
  EXPECT_EQ(spans[1].src, a.data() + 20);
  EXPECT_EQ(spans[1].dst, b.data() + 7);
  EXPECT_EQ(spans[1].nbytes, 15u);
  EXPECT_THROW(append_stream_copy(spans, src, 25, dst, 0, 10), InvalidArgument);
  EXPECT_THROW(append_stream_copy(spans, src, 0, dst, 25, 10), InvalidArgument);
}

std::byte value(uint64_t task, uint64_t offset, uint64_t round) {
  return static_cast<std::byte>((task * 131 + offset * 7 + round * 29) & 0xFF);
}

// Every rank sends task (src * world + dst) to every other rank: a row-strided
// source (every other 24-byte row of a 2x-as-tall buffer) into a column slice of
// the destination; same-rank tasks go through the local list. Runs `rounds` times
// with new source bytes and checks every destination byte, and that padding
// between the strided pieces is never written.
void run_persistent(int world, std::size_t slot_nbytes, int rounds) {
  ThreadFabric fabric(world, slot_nbytes);
  copy::CopyEngine engine(1);
  constexpr int64_t kRows = 50, kRow = 24;
  std::vector<MatchedTask> tasks;
  for (int src = 0; src < world; ++src) {
    for (int dst = 0; dst < world; ++dst) {
      if (src != dst) tasks.push_back({static_cast<uint64_t>(src * world + dst), kRows * kRow, src, dst});
    }
  }
  const Schedule schedule = schedule_matched_tasks(tasks, world, BatchLimits{slot_nbytes, 4});
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ThreadBuffers buffers(fabric, rank, static_cast<unsigned>(rank + 7));
        buffers.delays = true;
        PipelineExecutor executor(engine, buffers, rank);
        // Source of task to `dst`: rows 0, 2, 4, ... of a (2 * kRows, kRow) buffer.
        std::vector<std::vector<std::byte>> sources(world, std::vector<std::byte>(2 * kRows * kRow));
        // Destination of task from `src`: columns [8, 8 + kRow) of a (kRows, kRow + 16) buffer.
        std::vector<std::vector<std::byte>> targets(world, std::vector<std::byte>(kRows * (kRow + 16)));
        std::unordered_map<uint64_t, Pieces> sends, receives;
        PersistentSteps steps;
        for (int peer = 0; peer < world; ++peer) {
          const Pieces source = strided_pieces(sources[peer].data(), 1, {kRows, kRow}, {2 * kRow, 1});
          const Pieces target = strided_pieces(targets[peer].data() + 8, 1, {kRows, kRow}, {kRow + 16, 1});
          if (peer == rank) {
            append_stream_copy(steps.local, source, 0, target, 0, kRows * kRow);
            continue;
          }
          sends[static_cast<uint64_t>(rank * world + peer)] = source;
          receives[static_cast<uint64_t>(peer * world + rank)] = target;
        }
        std::vector<IterationSchedule> mine(schedule.num_iterations);
        for (const ScheduledBatch& batch : schedule.batches) {
          if (batch.src_rank == rank) mine[batch.iteration].send = batch;
          if (batch.dest_rank == rank) mine[batch.iteration].receive = batch;
        }
        steps.any_remote = true;
        add_pipeline_steps(steps, mine, sends, receives, buffers, rank);
        for (int round = 0; round < rounds; ++round) {
          for (int dst = 0; dst < world; ++dst) {
            for (int64_t r = 0; r < kRows; ++r) {
              for (int64_t c = 0; c < kRow; ++c) {
                sources[dst][static_cast<std::size_t>(2 * r * kRow + c)] =
                    value(static_cast<uint64_t>(rank * world + dst), static_cast<uint64_t>(r * kRow + c), round);
              }
            }
          }
          executor.execute_steps(steps, 42, static_cast<uint64_t>(round), static_cast<uint64_t>(round));
          for (int src = 0; src < world; ++src) {
            for (int64_t r = 0; r < kRows; ++r) {
              for (int64_t c = 0; c < kRow + 16; ++c) {
                const std::byte got = targets[src][static_cast<std::size_t>(r * (kRow + 16) + c)];
                const bool inside = c >= 8 && c < 8 + kRow;
                const std::byte want = inside ? value(static_cast<uint64_t>(src * world + rank),
                                                      static_cast<uint64_t>(r * kRow + c - 8), round)
                                              : std::byte{0};
                if (got != want) {
                  failures[static_cast<std::size_t>(rank)] = "round " + std::to_string(round) + " from rank " +
                                                             std::to_string(src) + " row " + std::to_string(r) +
                                                             " column " + std::to_string(c);
                  return;
                }
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
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(failures[static_cast<std::size_t>(rank)], "") << "rank " << rank;
}

TEST(PersistentPlanTest, MovesStridedViewsInPlaceBetweenTwoRanks) { run_persistent(2, 512, 4); }

TEST(PersistentPlanTest, MovesStridedViewsInPlaceBetweenThreeRanksAcrossManyIterations) {
  run_persistent(3, 256, 6);
}

// Two ranks running different plans (or versions) are refused on both, naming both.
TEST(PersistentPlanTest, RefusesRanksRunningDifferentPlansOrVersions) {
  ThreadFabric fabric(2, 256);
  copy::CopyEngine engine(1);
  for (const bool same_plan : {false, true}) {
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        ThreadBuffers buffers(fabric, rank, 1);
        PipelineExecutor executor(engine, buffers, rank);
        PersistentSteps steps;
        steps.any_remote = true;
        const uint64_t plan_id = same_plan ? 5 : 5 + static_cast<uint64_t>(rank);
        const uint64_t version = same_plan ? 10 + static_cast<uint64_t>(rank) : 10;
        try {
          executor.execute_steps(steps, plan_id, version, 0);
        } catch (const Error& error) {
          errors[static_cast<std::size_t>(rank)] = error.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (const std::string& error : errors) {
      EXPECT_NE(error.find(same_plan ? "runs version" : "runs plan"), std::string::npos) << error;
    }
  }
}

}  // namespace
}  // namespace tensorxfer::resharding
