// Step 1 of the schedule: pair every declared send with its receive.
#pragma once

#include <vector>

#include "tensorxfer/resharding/transfer_task.h"

namespace tensorxfer::resharding {

// Pairs sends and receives by task_id and returns the matched tasks sorted by
// task_id. Throws InvalidArgument, naming the task, before anything moves:
// a rank outside [0, world_size), a task_id declared twice on one side, a
// receive with no send or a send with no receive, two sides that disagree on
// the byte size or on the ranks. Same-rank tasks (src_rank == dest_rank) are
// matched and returned like the others; the caller copies them locally.
std::vector<MatchedTask> match_tasks(const std::vector<TaskEndpoint>& sends,
                                     const std::vector<TaskEndpoint>& receives, int world_size);

}  // namespace tensorxfer::resharding
