#include "tensorxfer/resharding/task_matcher.h"

#include <algorithm>
#include <unordered_map>

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

// task_id -> index into `endpoints`; refuses an id declared twice.
std::unordered_map<uint64_t, std::size_t> index_by_task(const std::vector<TaskEndpoint>& endpoints, int world_size,
                                                        const char* side) {
  std::unordered_map<uint64_t, std::size_t> index;
  index.reserve(endpoints.size());
  for (std::size_t i = 0; i < endpoints.size(); ++i) {
    const TaskEndpoint& endpoint = endpoints[i];
    check_ranks(endpoint, world_size, side);
    const auto [where, inserted] = index.emplace(endpoint.task_id, i);
    if (!inserted) {
      const TaskEndpoint& first = endpoints[where->second];
      throw InvalidArgument(detail::concat("task_id=", endpoint.task_id, " has two ", side, "s (rank ",
                                           first.src_rank, " -> ", first.dest_rank, " and rank ", endpoint.src_rank,
                                           " -> ", endpoint.dest_rank, ")"));
    }
  }
  return index;
}

}  // namespace

std::vector<MatchedTask> match_tasks(const std::vector<TaskEndpoint>& sends,
                                     const std::vector<TaskEndpoint>& receives, int world_size) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1, "world_size must be >= 1, got ", world_size);
  const auto send_index = index_by_task(sends, world_size, "send");
  const auto receive_index = index_by_task(receives, world_size, "receive");

  std::vector<MatchedTask> tasks;
  tasks.reserve(receives.size());
  for (const TaskEndpoint& receive : receives) {
    const auto found = send_index.find(receive.task_id);
    TENSORXFER_CHECK(InvalidArgument, found != send_index.end(), "missing send for task_id=", receive.task_id,
                     " (rank ", receive.dest_rank, " receives it from rank ", receive.src_rank, ")");
    const TaskEndpoint& send = sends[found->second];
    TENSORXFER_CHECK(InvalidArgument, send.src_rank == receive.src_rank && send.dest_rank == receive.dest_rank,
                     "task_id=", receive.task_id, ": the send goes rank ", send.src_rank, " -> ", send.dest_rank,
                     " but the receive expects rank ", receive.src_rank, " -> ", receive.dest_rank);
    TENSORXFER_CHECK(InvalidArgument, send.nbytes == receive.nbytes, "task_id=", receive.task_id, ": rank ",
                     send.src_rank, " sends ", send.nbytes, " bytes but rank ", receive.dest_rank, " receives ",
                     receive.nbytes, " bytes");
    tasks.push_back(MatchedTask{receive.task_id, receive.nbytes, receive.src_rank, receive.dest_rank});
  }
  for (const TaskEndpoint& send : sends) {
    TENSORXFER_CHECK(InvalidArgument, receive_index.count(send.task_id) == 1, "missing receive for task_id=",
                     send.task_id, " (rank ", send.src_rank, " sends it to rank ", send.dest_rank, ")");
  }
  std::sort(tasks.begin(), tasks.end(),
            [](const MatchedTask& a, const MatchedTask& b) { return a.task_id < b.task_id; });
  return tasks;
}

}  // namespace tensorxfer::resharding
