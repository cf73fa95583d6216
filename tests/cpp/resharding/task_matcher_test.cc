#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "tensorxfer/resharding/task_matcher.h"

namespace tensorxfer::resharding {
namespace {

using Kind = MatchProblem::Kind;
using Pairs = std::vector<std::pair<std::size_t, std::size_t>>;

TEST(FindTaskPairs, PairsInTaskIdOrderWhateverTheDeclarationOrder) {
  const std::vector<TaskEndpoint> sends = {{7, 8, 0, 1}, {2, 4, 1, 0}, {5, 0, 0, 0}};
  const std::vector<TaskEndpoint> receives = {{5, 0, 0, 0}, {7, 8, 0, 1}, {2, 4, 1, 0}};
  Pairs pairs;
  EXPECT_EQ(find_task_pairs(sends, receives, pairs).kind, Kind::kNone);
  EXPECT_EQ(pairs, (Pairs{{1, 2}, {2, 0}, {0, 1}}));
}

TEST(FindTaskPairs, ReportsTheFirstProblemInTheDocumentedOrder) {
  Pairs pairs;
  // Duplicates first (sends before receives), even with a lower missing id.
  auto problem = find_task_pairs({{3, 1, 0, 1}, {9, 1, 0, 1}, {3, 1, 1, 0}}, {{1, 1, 0, 1}, {9, 1, 0, 1}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kDuplicateSend);
  EXPECT_EQ(std::make_pair(problem.send_index, problem.other_index), std::make_pair(std::size_t{0}, std::size_t{2}));
  EXPECT_TRUE(pairs.empty());
  problem = find_task_pairs({{1, 1, 0, 1}}, {{1, 1, 0, 1}, {1, 1, 0, 1}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kDuplicateReceive);
  // Then the lowest id one side lacks.
  problem = find_task_pairs({{4, 1, 0, 1}, {6, 1, 0, 1}}, {{6, 1, 0, 1}, {5, 1, 0, 1}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kMissingReceive);
  EXPECT_EQ(problem.send_index, 0u);
  problem = find_task_pairs({{6, 1, 0, 1}}, {{6, 1, 0, 1}, {5, 1, 0, 1}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kMissingSend);
  EXPECT_EQ(problem.receive_index, 1u);
  // Then ranks before sizes, each at its lowest id.
  problem = find_task_pairs({{1, 1, 0, 1}, {2, 1, 0, 1}}, {{1, 9, 0, 1}, {2, 1, 1, 0}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kRanksDiffer);
  EXPECT_EQ(std::make_pair(problem.send_index, problem.receive_index), std::make_pair(std::size_t{1}, std::size_t{1}));
  problem = find_task_pairs({{1, 1, 0, 1}, {2, 1, 0, 1}}, {{2, 3, 0, 1}, {1, 1, 0, 1}}, pairs);
  EXPECT_EQ(problem.kind, Kind::kSizesDiffer);
  EXPECT_EQ(std::make_pair(problem.send_index, problem.receive_index), std::make_pair(std::size_t{1}, std::size_t{0}));
}

TEST(FindTaskPairs, EmptyIsMatched) {
  Pairs pairs = {{1, 1}};
  EXPECT_EQ(find_task_pairs({}, {}, pairs).kind, Kind::kNone);
  EXPECT_TRUE(pairs.empty());
}

}  // namespace
}  // namespace tensorxfer::resharding
