#include "tensorxfer/resharding/task_matcher.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

void check_ranks(const TaskEndpoint& endpoint, int world_size, const char* side) {
  const auto in_range = [&](int32_t rank) { return rank >= 0 && rank < world_size; };
  TENSORXFER_CHECK(InvalidArgument, in_range(endpoint.src_rank) && in_range(endpoint.dest_rank), side,
                   " of task_id=", endpoint.task_id, " names ranks ", endpoint.src_rank, " -> ", endpoint.dest_rank,
                   ", expected ranks in [0, ", world_size, ")");
}

// Indices of `endpoints` in task_id order (stable: the first declaration first).
std::vector<std::size_t> by_task_id(const std::vector<TaskEndpoint>& endpoints) {
  std::vector<std::size_t> order(endpoints.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return endpoints[a].task_id < endpoints[b].task_id;
  });
  return order;
}

// The first adjacent pair in `order` with equal task ids, as (first, second), or none.
bool first_duplicate(const std::vector<TaskEndpoint>& endpoints, const std::vector<std::size_t>& order,
                     std::size_t& first, std::size_t& second) {
  for (std::size_t k = 1; k < order.size(); ++k) {
    if (endpoints[order[k]].task_id == endpoints[order[k - 1]].task_id) {
      first = order[k - 1];
      second = order[k];
      return true;
    }
  }
  return false;
}

}  // namespace

MatchProblem find_task_pairs(const std::vector<TaskEndpoint>& sends, const std::vector<TaskEndpoint>& receives,
                             std::vector<std::pair<std::size_t, std::size_t>>& pairs) {
  pairs.clear();
  MatchProblem problem;
  const auto send_order = by_task_id(sends);
  const auto receive_order = by_task_id(receives);
  if (first_duplicate(sends, send_order, problem.send_index, problem.other_index)) {
    problem.kind = MatchProblem::Kind::kDuplicateSend;
    return problem;
  }
  if (first_duplicate(receives, receive_order, problem.receive_index, problem.other_index)) {
    problem.kind = MatchProblem::Kind::kDuplicateReceive;
    return problem;
  }
  // Merge both sides in task_id order: the first id one side lacks is missing.
  std::vector<std::pair<std::size_t, std::size_t>> merged;
  merged.reserve(receives.size());
  std::size_t s = 0, r = 0;
  while (s < send_order.size() || r < receive_order.size()) {
    const bool have_send = s < send_order.size(), have_receive = r < receive_order.size();
    const uint64_t send_id = have_send ? sends[send_order[s]].task_id : 0;
    const uint64_t receive_id = have_receive ? receives[receive_order[r]].task_id : 0;
    if (have_send && (!have_receive || send_id < receive_id)) {
      problem.kind = MatchProblem::Kind::kMissingReceive;
      problem.send_index = send_order[s];
      return problem;
    }
    if (have_receive && (!have_send || receive_id < send_id)) {
      problem.kind = MatchProblem::Kind::kMissingSend;
      problem.receive_index = receive_order[r];
      return problem;
    }
    merged.emplace_back(send_order[s++], receive_order[r++]);
  }
  for (const auto& [send, receive] : merged) {
    if (sends[send].src_rank != receives[receive].src_rank || sends[send].dest_rank != receives[receive].dest_rank) {
      return MatchProblem{MatchProblem::Kind::kRanksDiffer, send, receive, 0};
    }
  }
  for (const auto& [send, receive] : merged) {
    if (sends[send].nbytes != receives[receive].nbytes) {
      return MatchProblem{MatchProblem::Kind::kSizesDiffer, send, receive, 0};
    }
  }
  pairs = std::move(merged);
  return problem;
}

std::vector<MatchedTask> match_tasks(const std::vector<TaskEndpoint>& sends,
                                     const std::vector<TaskEndpoint>& receives, int world_size) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1, "world_size must be >= 1, got ", world_size);
  for (const TaskEndpoint& send : sends) check_ranks(send, world_size, "send");
  for (const TaskEndpoint& receive : receives) check_ranks(receive, world_size, "receive");
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  const MatchProblem problem = find_task_pairs(sends, receives, pairs);
  using Kind = MatchProblem::Kind;
  switch (problem.kind) {
    case Kind::kNone:
      break;
    case Kind::kDuplicateSend:
    case Kind::kDuplicateReceive: {
      const bool send_side = problem.kind == Kind::kDuplicateSend;
      const auto& side = send_side ? sends : receives;
      const TaskEndpoint& first = side[send_side ? problem.send_index : problem.receive_index];
      const TaskEndpoint& second = side[problem.other_index];
      throw InvalidArgument(detail::concat("task_id=", first.task_id, " has two ", send_side ? "send" : "receive",
                                           "s (rank ", first.src_rank, " -> ", first.dest_rank, " and rank ",
                                           second.src_rank, " -> ", second.dest_rank, ")"));
    }
    case Kind::kMissingReceive: {
      const TaskEndpoint& send = sends[problem.send_index];
      throw InvalidArgument(detail::concat("missing receive for task_id=", send.task_id, " (rank ", send.src_rank,
                                           " sends it to rank ", send.dest_rank, ")"));
    }
    case Kind::kMissingSend: {
      const TaskEndpoint& receive = receives[problem.receive_index];
      throw InvalidArgument(detail::concat("missing send for task_id=", receive.task_id, " (rank ",
                                           receive.dest_rank, " receives it from rank ", receive.src_rank, ")"));
    }
    case Kind::kRanksDiffer: {
      const TaskEndpoint& send = sends[problem.send_index];
      const TaskEndpoint& receive = receives[problem.receive_index];
      throw InvalidArgument(detail::concat("task_id=", receive.task_id, ": the send goes rank ", send.src_rank,
                                           " -> ", send.dest_rank, " but the receive expects rank ",
                                           receive.src_rank, " -> ", receive.dest_rank));
    }
    case Kind::kSizesDiffer: {
      const TaskEndpoint& send = sends[problem.send_index];
      const TaskEndpoint& receive = receives[problem.receive_index];
      throw InvalidArgument(detail::concat("task_id=", receive.task_id, ": rank ", send.src_rank, " sends ",
                                           send.nbytes, " bytes but rank ", receive.dest_rank, " receives ",
                                           receive.nbytes, " bytes"));
    }
  }
  std::vector<MatchedTask> tasks;
  tasks.reserve(pairs.size());
  for (const auto& [send, receive] : pairs) {
    const TaskEndpoint& matched = receives[receive];
    tasks.push_back(MatchedTask{matched.task_id, matched.nbytes, matched.src_rank, matched.dest_rank});
  }
  return tasks;
}

}  // namespace tensorxfer::resharding
