// NUMA placement of the whole pages a host tensor covers: bind them to a node
// (moving the resident ones), prefer the caller's local node, and report page by
// page which node holds them. Built on libnuma (TENSORXFER_WITH_NUMA); without
// it every call throws Unsupported.
//
// Every call validates its view (host memory, C-contiguous); an empty view is a
// no-op. Policies apply to whole pages, so bytes sharing the first or last page
// with the tensor follow the same policy.
#pragma once

#include <string>
#include <vector>

#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::memory {

// True when this build has libnuma and the kernel answers NUMA calls.
bool numa_supported() noexcept;
// Why numa_supported() is false ("" when it is true).
std::string numa_unsupported_reason();

// The nodes this process may allocate memory on, ascending.
// Throws Unsupported when NUMA is unavailable.
std::vector<int> numa_nodes_with_memory();

// The node of the CPU the calling thread runs on now.
// Throws Unsupported when NUMA is unavailable.
int current_numa_node();

// Binds the pages to `node` (MPOL_BIND) and moves the resident ones there
// (MPOL_MF_MOVE | MPOL_MF_STRICT); pages touched later are allocated there.
// Throws InvalidArgument when `node` is not one of numa_nodes_with_memory()
// (the message lists them), SystemError when mbind fails.
void bind_to_numa_node(const TensorView& view, const char* argument, int node);

// Sets MPOL_PREFERRED for the calling thread's current node (no migration:
// a hint for pages allocated later) and returns that node.
int prefer_local_numa_node(const TensorView& view, const char* argument);

// For each page the view covers, the node holding it, or a negative errno
// (-ENOENT: not resident yet, -EFAULT: not mapped). move_pages(2) query mode.
std::vector<int> numa_nodes_of(const TensorView& view, const char* argument);

// The memory policy of the first page the view covers (get_mempolicy MPOL_F_ADDR).
struct NumaPolicy {
  std::string mode;        // "default", "preferred", "bind", "interleave", "local", ...
  std::vector<int> nodes;  // the policy's node mask, ascending
};
NumaPolicy numa_policy_of(const TensorView& view, const char* argument);

}  // namespace tensorxfer::memory
