// The task matcher fed with the peer descriptions every rank all-gathers:
// (task_id, nbytes, src_rank, dest_rank) for every send and receive, any of
// which a buggy or stale peer may get wrong.
//
// Contract (task_matcher.h): match_tasks returns the tasks sorted by task_id,
// one per id, each agreeing with its send and its receive, or throws
// InvalidArgument; find_task_pairs reports a problem exactly when match_tasks
// refuses ranks that are in range.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuzz_support.h"
#include "tensorxfer/resharding/task_matcher.h"

namespace {

using tensorxfer::InvalidArgument;
using tensorxfer::fuzz::FuzzInput;
using tensorxfer::resharding::MatchedTask;
using tensorxfer::resharding::MatchProblem;
using tensorxfer::resharding::TaskEndpoint;

// Small values most of the time (so ids collide and ranks fall in range), any value sometimes.
uint64_t take_id(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  return (tag & 0x80) != 0 ? input.take<uint64_t>() : tag;
}

int32_t take_rank(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  if ((tag & 0xC0) == 0xC0) return input.take<int32_t>();
  return static_cast<int32_t>(tag & 0x0F) - 1;  // -1..14
}

uint64_t take_nbytes(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  return (tag & 0x80) != 0 ? input.take<uint64_t>() : tag;
}

TaskEndpoint take_endpoint(FuzzInput& input) {
  TaskEndpoint endpoint;
  endpoint.task_id = take_id(input);
  endpoint.nbytes = take_nbytes(input);
  endpoint.src_rank = take_rank(input);
  endpoint.dest_rank = take_rank(input);
  return endpoint;
}

// The receive a peer declares for `send`, sometimes with one field changed.
TaskEndpoint mirror(const TaskEndpoint& send, FuzzInput& input) {
  TaskEndpoint receive = send;
  switch (input.take<uint8_t>() % 8) {
    case 0: receive.task_id = take_id(input); break;
    case 1: receive.nbytes = take_nbytes(input); break;
    case 2: receive.src_rank = take_rank(input); break;
    case 3: receive.dest_rank = take_rank(input); break;
    default: break;
  }
  return receive;
}

bool same(const TaskEndpoint& a, const MatchedTask& b) {
  return a.task_id == b.task_id && a.nbytes == b.nbytes && a.src_rank == b.src_rank && a.dest_rank == b.dest_rank;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  const int world_size = input.take_in<int>(-2, 40);
  const std::size_t send_count = input.take_in<std::size_t>(0, 64);
  std::vector<TaskEndpoint> sends, receives;
  for (std::size_t i = 0; i < send_count && !input.empty(); ++i) sends.push_back(take_endpoint(input));
  if (input.take_bool()) {
    // The receivers' view of the same tasks, shuffled by a rotation, some fields changed.
    for (const TaskEndpoint& send : sends) receives.push_back(mirror(send, input));
    if (!receives.empty()) {
      std::rotate(receives.begin(), receives.begin() + input.take_in<std::size_t>(0, receives.size() - 1),
                  receives.end());
    }
    if (input.take_bool() && !receives.empty()) receives.pop_back();
    if (input.take_bool()) receives.push_back(take_endpoint(input));
  } else {
    const std::size_t receive_count = input.take_in<std::size_t>(0, 64);
    for (std::size_t i = 0; i < receive_count && !input.empty(); ++i) receives.push_back(take_endpoint(input));
  }

  std::vector<MatchedTask> tasks;
  const bool matched = tensorxfer::fuzz::accepted<InvalidArgument>(
      "match_tasks", [&] { tasks = tensorxfer::resharding::match_tasks(sends, receives, world_size); });

  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  const MatchProblem problem = tensorxfer::resharding::find_task_pairs(sends, receives, pairs);
  TENSORXFER_FUZZ_EXPECT((problem.kind == MatchProblem::Kind::kNone) == !pairs.empty() || sends.empty(),
                         "find_task_pairs fills pairs exactly when it finds no problem");
  if (problem.kind != MatchProblem::Kind::kNone) {
    TENSORXFER_FUZZ_EXPECT(!matched, "match_tasks accepted what find_task_pairs refuses (problem ",
                           static_cast<int>(problem.kind), ")");
    const std::size_t send_bound = sends.size(), receive_bound = receives.size();
    switch (problem.kind) {
      case MatchProblem::Kind::kDuplicateSend:
        TENSORXFER_FUZZ_EXPECT(problem.send_index < send_bound && problem.other_index < send_bound &&
                                   sends[problem.send_index].task_id == sends[problem.other_index].task_id &&
                                   problem.send_index != problem.other_index,
                               "a duplicate send names two sends of one id");
        break;
      case MatchProblem::Kind::kDuplicateReceive:
        TENSORXFER_FUZZ_EXPECT(problem.receive_index < receive_bound && problem.other_index < receive_bound &&
                                   receives[problem.receive_index].task_id ==
                                       receives[problem.other_index].task_id &&
                                   problem.receive_index != problem.other_index,
                               "a duplicate receive names two receives of one id");
        break;
      case MatchProblem::Kind::kMissingReceive:
        TENSORXFER_FUZZ_EXPECT(problem.send_index < send_bound, "index in range");
        for (const TaskEndpoint& receive : receives) {
          TENSORXFER_FUZZ_EXPECT(receive.task_id != sends[problem.send_index].task_id,
                                 "a send reported without receive has one");
        }
        break;
      case MatchProblem::Kind::kMissingSend:
        TENSORXFER_FUZZ_EXPECT(problem.receive_index < receive_bound, "index in range");
        for (const TaskEndpoint& send : sends) {
          TENSORXFER_FUZZ_EXPECT(send.task_id != receives[problem.receive_index].task_id,
                                 "a receive reported without send has one");
        }
        break;
      default:
        TENSORXFER_FUZZ_EXPECT(problem.send_index < send_bound && problem.receive_index < receive_bound &&
                                   sends[problem.send_index].task_id == receives[problem.receive_index].task_id,
                               "a disagreement names a send and a receive of one id");
        break;
    }
  } else {
    const bool ranks_in_range = world_size >= 1 && std::all_of(sends.begin(), sends.end(), [&](const auto& s) {
      return s.src_rank >= 0 && s.src_rank < world_size && s.dest_rank >= 0 && s.dest_rank < world_size;
    });
    TENSORXFER_FUZZ_EXPECT(matched == ranks_in_range, "match_tasks refuses only ranks out of range once ",
                           "find_task_pairs finds the tasks consistent");
  }

  if (matched) {
    TENSORXFER_FUZZ_EXPECT(tasks.size() == sends.size() && tasks.size() == receives.size(),
                           "one task per send and per receive");
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      TENSORXFER_FUZZ_EXPECT(i == 0 || tasks[i - 1].task_id < tasks[i].task_id, "tasks sorted, ids unique");
      TENSORXFER_FUZZ_EXPECT(tasks[i].src_rank >= 0 && tasks[i].src_rank < world_size && tasks[i].dest_rank >= 0 &&
                                 tasks[i].dest_rank < world_size,
                             "ranks in range");
      const auto by_id = [&](const TaskEndpoint& e) { return e.task_id == tasks[i].task_id; };
      const auto send = std::find_if(sends.begin(), sends.end(), by_id);
      const auto receive = std::find_if(receives.begin(), receives.end(), by_id);
      TENSORXFER_FUZZ_EXPECT(send != sends.end() && receive != receives.end() && same(*send, tasks[i]) &&
                                 same(*receive, tasks[i]),
                             "task_id=", tasks[i].task_id, " agrees with its send and its receive");
    }
  }
  return 0;
}
