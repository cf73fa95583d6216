// Step 1 of the schedule: pair every declared send with its receive.
#pragma once

#include <cstddef>
#include <vector>

#include "tensorxfer/resharding/transfer_task.h"

namespace tensorxfer::resharding {

// The first thing wrong with a set of sends and receives, for callers that word
// their own errors (the copy services name tasks by their own keys). Checked in
// this order, each time for the lowest task_id: an id declared twice on the send
// side, then on the receive side; an id with a send but no receive or the
// reverse; a send and receive that disagree on the ranks; then on the byte size.
struct MatchProblem {
  enum class Kind { kNone, kDuplicateSend, kDuplicateReceive, kMissingReceive, kMissingSend, kRanksDiffer,
                    kSizesDiffer };
  Kind kind = Kind::kNone;
  // Indices into the sends / receives given (the second of a duplicate pair for
  // kDuplicate*: `send_index` / `receive_index` is the first, `other_index` the second).
  std::size_t send_index = 0;
  std::size_t receive_index = 0;
  std::size_t other_index = 0;
};

// Pairs sends and receives by task_id. On success returns kNone and fills
// `pairs` with (send index, receive index), sorted by task_id; otherwise
// returns the first problem (see MatchProblem) and leaves `pairs` empty.
MatchProblem find_task_pairs(const std::vector<TaskEndpoint>& sends, const std::vector<TaskEndpoint>& receives,
                             std::vector<std::pair<std::size_t, std::size_t>>& pairs);

// Pairs sends and receives by task_id and returns the matched tasks sorted by
// task_id. Throws InvalidArgument, naming the task, before anything moves:
// a rank outside [0, world_size), a task_id declared twice on one side, a
// receive with no send or a send with no receive, two sides that disagree on
// the byte size or on the ranks (find_task_pairs' order). Same-rank tasks
// (src_rank == dest_rank) are matched and returned like the others; the
// caller copies them locally.
std::vector<MatchedTask> match_tasks(const std::vector<TaskEndpoint>& sends,
                                     const std::vector<TaskEndpoint>& receives, int world_size);

}  // namespace tensorxfer::resharding
