// NUMA placement of the whole pages a host tensor covers: bind them to a node
// (moving the resident ones), prefer the caller's local node, and report page by
// page which node holds them.
//
// Built on the kernel alone, so every build behaves the same: the system calls
// mbind, get_mempolicy, set_mempolicy and move_pages are made through syscall(2)
// (no libnuma), and nodes are discovered from /sys/devices/system/node. What the
// kernel permits is decided when a call runs: where it refuses a NUMA system call
// (ENOSYS: a kernel built without NUMA; EPERM: a container's seccomp profile
// without CAP_SYS_NICE) the call throws Unsupported naming the system call and
// the errno; any other failure throws SystemError carrying its errno.
//
// Every placement call validates its view (host memory, C-contiguous); an empty
// view is a no-op. Policies apply to whole pages, so bytes sharing the first or
// last page with the tensor follow the same policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::memory {

// ---- nodes (sysfs) -----------------------------------------------------------

// One online node as /sys/devices/system/node describes it.
struct NumaNode {
  int id = 0;
  std::vector<int> cpus;           // nodeN/cpulist, ascending (empty for a memory-only node)
  std::uint64_t memory_bytes = 0;  // MemTotal of nodeN/meminfo (0 for a CPU-only node)
};

// The online nodes under `root` (the `online` list, then each node's cpulist and
// meminfo), ascending by id. Empty when `root` does not exist (a kernel without
// NUMA, or sysfs not mounted). Throws SystemError when a file that must be there
// cannot be read, InvalidArgument when one does not parse.
std::vector<NumaNode> numa_online_nodes(const std::string& root = "/sys/devices/system/node");

// Parses a kernel id list ("0-3,8,10-11"; "" is empty) into ascending ids.
// Throws InvalidArgument naming `what` and the text when it does not parse.
std::vector<int> parse_numa_id_list(const std::string& text, const std::string& what);

// The nodes this process may allocate memory on, ascending: the online nodes with
// memory, limited to the process's cpuset (Mems_allowed_list of /proc/self/status).
// Without the sysfs directory the cpuset list alone, and without either {0}: a
// machine without NUMA is one node. Needs no NUMA system call.
std::vector<int> numa_nodes_with_memory();

// The choice numa_nodes_with_memory() makes from the online nodes and the cpuset's
// memory nodes (nullopt: no cpuset information).
std::vector<int> select_nodes_with_memory(const std::vector<NumaNode>& online,
                                          const std::optional<std::vector<int>>& allowed);

// The node of the CPU the calling thread runs on now (getcpu(2)).
int current_numa_node();

// ---- what the kernel permits ----------------------------------------------------

// One NUMA system call tried now, harmlessly: get_mempolicy reads the thread's
// policy; set_mempolicy sets the default policy on a short-lived thread of its
// own; mbind sets the default policy on a page mapped for the probe; move_pages
// asks which node holds that page.
struct NumaSystemCallProbe {
  std::string name;      // "get_mempolicy", "set_mempolicy", "mbind", "move_pages"
  bool permitted = false;
  int error_number = 0;  // the errno when not permitted, else 0
  std::string detail;    // "ok", or the errno and what it means here
};
std::vector<NumaSystemCallProbe> probe_numa_system_calls();

// True when the kernel answers the system calls the placement calls below use
// (get_mempolicy, mbind, move_pages), probed now.
bool numa_supported() noexcept;
// Why numa_supported() is false ("" when it is true).
std::string numa_unsupported_reason();

// ---- placement -------------------------------------------------------------------

// Binds the pages to `node` (MPOL_BIND) and moves the resident ones there
// (MPOL_MF_MOVE | MPOL_MF_STRICT); pages touched later are allocated there.
// Throws InvalidArgument when `node` is not one of numa_nodes_with_memory()
// (the message lists them); Unsupported / SystemError when mbind fails (above).
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
