#include "tensorxfer/memory/numa.h"

#include <algorithm>
#include <cerrno>
#include <sstream>
#include <string>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"

#ifdef TENSORXFER_WITH_NUMA
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#endif

namespace tensorxfer::memory {
namespace {

std::string join(const std::vector<int>& values) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
  return out.str();
}

void require_numa() {
  if (!numa_supported()) throw Unsupported("NUMA placement is unavailable: " + numa_unsupported_reason());
}

#ifdef TENSORXFER_WITH_NUMA

// A libnuma node mask sized for every possible node; freed on scope exit.
class NodeMask {
 public:
  NodeMask() : mask_(numa_allocate_nodemask()) {
    if (mask_ == nullptr) throw SystemError("numa_allocate_nodemask", ENOMEM);
  }
  NodeMask(const NodeMask&) = delete;
  NodeMask& operator=(const NodeMask&) = delete;
  ~NodeMask() { numa_bitmask_free(mask_); }

  void set(int node) { numa_bitmask_setbit(mask_, static_cast<unsigned>(node)); }
  bool test(int node) const { return numa_bitmask_isbitset(mask_, static_cast<unsigned>(node)) != 0; }
  int bit_count() const { return static_cast<int>(mask_->size); }
  unsigned long* bits() { return mask_->maskp; }
  // The kernel reads one bit fewer than it is told (see mbind(2)); libnuma passes size + 1 too.
  unsigned long kernel_max_node() const { return mask_->size + 1; }

 private:
  bitmask* mask_;
};

void require_node_with_memory(int node, const char* argument) {
  const std::vector<int> nodes = numa_nodes_with_memory();
  for (int candidate : nodes) {
    if (candidate == node) return;
  }
  throw InvalidArgument(std::string("bind_to_numa_node(") + argument +
                        "): node must be one of the NUMA nodes this process can allocate on " +
                        join(nodes) + ", got " + std::to_string(node));
}

const char* policy_mode_name(int mode) {
  switch (mode) {
    case MPOL_DEFAULT: return "default";
    case MPOL_PREFERRED: return "preferred";
    case MPOL_BIND: return "bind";
    case MPOL_INTERLEAVE: return "interleave";
    case 4: return "local";             // MPOL_LOCAL (Linux 3.8)
    case 5: return "preferred_many";    // MPOL_PREFERRED_MANY (Linux 5.15)
    case 6: return "weighted_interleave";  // MPOL_WEIGHTED_INTERLEAVE (Linux 6.9)
    default: return "unknown";
  }
}

#endif  // TENSORXFER_WITH_NUMA

}  // namespace

bool numa_supported() noexcept { return numa_unsupported_reason().empty(); }

std::string numa_unsupported_reason() {
#ifdef TENSORXFER_WITH_NUMA
  if (numa_available() < 0) {
    return "the kernel does not answer NUMA system calls (numa_available() < 0; "
           "NUMA disabled or blocked by seccomp)";
  }
  return "";
#else
  return "this build of tensorxfer has no libnuma (rebuild with libnuma-dev installed "
         "and -DTENSORXFER_WITH_NUMA=ON)";
#endif
}

std::vector<int> numa_nodes_with_memory() {
  require_numa();
  std::vector<int> nodes;
#ifdef TENSORXFER_WITH_NUMA
  const int max_node = numa_max_node();
  for (int node = 0; node <= max_node; ++node) {
    if (numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node))) nodes.push_back(node);
  }
#endif
  return nodes;
}

int current_numa_node() {
  require_numa();
#ifdef TENSORXFER_WITH_NUMA
  const int cpu = sched_getcpu();
  if (cpu < 0) throw_system_error("sched_getcpu");
  const int node = numa_node_of_cpu(cpu);
  if (node < 0) throw_system_error("numa_node_of_cpu(" + std::to_string(cpu) + ")");
  return node;
#else
  return -1;
#endif
}

void bind_to_numa_node(const TensorView& view, const char* argument, int node) {
  require_contiguous_host(view, argument);
  require_numa();
#ifdef TENSORXFER_WITH_NUMA
  require_node_with_memory(node, argument);
  const PageSpan span = page_span_of(view.data, view.nbytes());
  if (span.length == 0) return;
  NodeMask mask;
  mask.set(node);
  if (mbind(span.begin, span.length, MPOL_BIND, mask.bits(), mask.kernel_max_node(),
            MPOL_MF_MOVE | MPOL_MF_STRICT) != 0) {
    throw_system_error("mbind(MPOL_BIND node " + std::to_string(node) + ", " +
                       std::to_string(span.length) + " bytes, MPOL_MF_MOVE|MPOL_MF_STRICT)");
  }
#endif
}

int prefer_local_numa_node(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  const int node = current_numa_node();
#ifdef TENSORXFER_WITH_NUMA
  const PageSpan span = page_span_of(view.data, view.nbytes());
  if (span.length == 0) return node;
  NodeMask mask;
  mask.set(node);
  if (mbind(span.begin, span.length, MPOL_PREFERRED, mask.bits(), mask.kernel_max_node(), 0) != 0) {
    throw_system_error("mbind(MPOL_PREFERRED node " + std::to_string(node) + ", " +
                       std::to_string(span.length) + " bytes)");
  }
#endif
  return node;
}

std::vector<int> numa_nodes_of(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  require_numa();
  const PageSpan span = page_span_of(view.data, view.nbytes());
  std::vector<int> status(span.page_count(), -EFAULT);
#ifdef TENSORXFER_WITH_NUMA
  constexpr std::size_t kPagesPerCall = 65536;
  std::vector<void*> pages;
  for (std::size_t first = 0; first < status.size(); first += kPagesPerCall) {
    const std::size_t count = std::min(kPagesPerCall, status.size() - first);
    pages.resize(count);
    for (std::size_t i = 0; i < count; ++i) pages[i] = span.begin + (first + i) * page_size();
    if (move_pages(0, count, pages.data(), nullptr, status.data() + first, 0) != 0) {
      throw_system_error("move_pages(query " + std::to_string(count) + " pages)");
    }
  }
#endif
  return status;
}

NumaPolicy numa_policy_of(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  require_numa();
  if (view.nbytes() == 0) {
    throw InvalidArgument(std::string(argument) + ": an empty tensor covers no pages, got " +
                          view.describe());
  }
  NumaPolicy policy;
#ifdef TENSORXFER_WITH_NUMA
  NodeMask mask;
  int mode = 0;
  void* address = page_span_of(view.data, view.nbytes()).begin;
  if (get_mempolicy(&mode, mask.bits(), mask.kernel_max_node(), address, MPOL_F_ADDR) != 0) {
    throw_system_error("get_mempolicy(MPOL_F_ADDR)");
  }
  // Strip the mode flags (MPOL_F_STATIC_NODES, MPOL_F_RELATIVE_NODES, MPOL_F_NUMA_BALANCING).
  mode &= ~((1 << 15) | (1 << 14) | (1 << 13));
  policy.mode = policy_mode_name(mode);
  for (int node = 0; node < mask.bit_count(); ++node) {
    if (mask.test(node)) policy.nodes.push_back(node);
  }
#endif
  return policy;
}

}  // namespace tensorxfer::memory
