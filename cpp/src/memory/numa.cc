// NUMA placement through the kernel's system calls, made with syscall(2): glibc
// has no wrappers for them (libnuma's are what this file replaces).
#include "tensorxfer/memory/numa.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"

#if __has_include(<linux/mempolicy.h>)
#include <linux/mempolicy.h>
#else
// The kernel's ABI values (include/uapi/linux/mempolicy.h), for C libraries
// without the kernel headers.
enum { MPOL_DEFAULT = 0, MPOL_PREFERRED = 1, MPOL_BIND = 2, MPOL_INTERLEAVE = 3 };
#define MPOL_F_ADDR (1 << 1)
#define MPOL_MF_STRICT (1 << 0)
#define MPOL_MF_MOVE (1 << 1)
#endif

namespace tensorxfer::memory {
namespace {

// Policy modes and mode flags newer than some kernel headers; the values are the kernel's.
constexpr int kPolicyLocal = 4;                // MPOL_LOCAL (Linux 3.8)
constexpr int kPolicyPreferredMany = 5;        // MPOL_PREFERRED_MANY (Linux 5.15)
constexpr int kPolicyWeightedInterleave = 6;   // MPOL_WEIGHTED_INTERLEAVE (Linux 6.9)
constexpr int kPolicyModeFlags = (1 << 15) | (1 << 14) | (1 << 13);  // MPOL_F_STATIC_NODES,
                                                                     // _RELATIVE_NODES, _NUMA_BALANCING

// ---- the system calls ------------------------------------------------------------
// Each returns 0 or -1 with errno set, like the libc wrappers they stand in for.

long sys_mbind(void* start, unsigned long length, int mode, const unsigned long* mask,
               unsigned long max_node, unsigned flags) {
  return ::syscall(SYS_mbind, start, length, mode, mask, max_node, flags);
}

long sys_get_mempolicy(int* mode, unsigned long* mask, unsigned long max_node, void* address,
                       unsigned long flags) {
  return ::syscall(SYS_get_mempolicy, mode, mask, max_node, address, flags);
}

long sys_set_mempolicy(int mode, const unsigned long* mask, unsigned long max_node) {
  return ::syscall(SYS_set_mempolicy, mode, mask, max_node);
}

long sys_move_pages(unsigned long count, void** pages, const int* nodes, int* status, int flags) {
  return ::syscall(SYS_move_pages, 0 /* this process */, count, pages, nodes, status, flags);
}

// What an errno from a NUMA system call means here.
bool kernel_forbids(int error_number) { return error_number == ENOSYS || error_number == EPERM; }

std::string forbidden_detail(int error_number) {
  if (error_number == ENOSYS) return "ENOSYS: this kernel was built without NUMA support";
  return "EPERM: this process may not make NUMA system calls (a container's seccomp profile "
         "allows them only with CAP_SYS_NICE)";
}

// Unsupported where the kernel forbids the call, else SystemError with the errno.
[[noreturn]] void throw_numa_call_error(const std::string& what_failed, int error_number) {
  if (kernel_forbids(error_number)) {
    throw Unsupported("NUMA placement is unavailable: " + what_failed + " failed with " +
                      forbidden_detail(error_number));
  }
  throw SystemError(what_failed, error_number);
}

// A node mask for the system calls, wide enough for any kernel's node count
// (MAX_NUMNODES is at most 1024 on every architecture).
class NodeMask {
 public:
  static constexpr int kBits = 1024;
  static constexpr int kBitsPerWord = 8 * sizeof(unsigned long);

  void set(int node) { words_[node / kBitsPerWord] |= 1UL << (node % kBitsPerWord); }
  bool test(int node) const { return (words_[node / kBitsPerWord] >> (node % kBitsPerWord)) & 1UL; }
  unsigned long* words() { return words_; }
  const unsigned long* words() const { return words_; }
  // The kernel reads one bit fewer than it is told (mbind(2): "maxnode - 1").
  static constexpr unsigned long kernel_max_node() { return kBits + 1; }

 private:
  unsigned long words_[kBits / kBitsPerWord] = {};
};

NodeMask mask_of(int node) {
  NodeMask mask;
  mask.set(node);
  return mask;
}

std::string join(const std::vector<int>& values) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
  return out.str();
}

void require_node_with_memory(int node, const char* argument) {
  const std::vector<int> nodes = numa_nodes_with_memory();
  if (std::find(nodes.begin(), nodes.end(), node) != nodes.end()) return;
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
    case kPolicyLocal: return "local";
    case kPolicyPreferredMany: return "preferred_many";
    case kPolicyWeightedInterleave: return "weighted_interleave";
    default: return "unknown";
  }
}

// ---- probes ------------------------------------------------------------------------

NumaSystemCallProbe probe_result(const char* name, long result, int error_number) {
  NumaSystemCallProbe probe;
  probe.name = name;
  probe.permitted = result == 0;
  probe.error_number = probe.permitted ? 0 : error_number;
  if (probe.permitted) {
    probe.detail = "ok";
  } else if (kernel_forbids(error_number)) {
    probe.detail = forbidden_detail(error_number);
  } else {
    probe.detail = std::string(std::strerror(error_number)) + " (errno " + std::to_string(error_number) + ")";
  }
  return probe;
}

NumaSystemCallProbe probe_get_mempolicy() {
  int mode = 0;
  const long result = sys_get_mempolicy(&mode, nullptr, 0, nullptr, 0);
  return probe_result("get_mempolicy", result, errno);
}

// On a thread of its own, so no thread of the caller changes policy.
NumaSystemCallProbe probe_set_mempolicy() {
  long result = -1;
  int error_number = 0;
  std::thread([&] {
    result = sys_set_mempolicy(MPOL_DEFAULT, nullptr, 0);
    error_number = errno;
  }).join();
  return probe_result("set_mempolicy", result, error_number);
}

// One anonymous page for the probes, unmapped on scope exit.
class ProbePage {
 public:
  ProbePage() : length_(page_size()) {
    void* page = ::mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) throw_system_error("mmap (NUMA probe page)");
    page_ = page;
  }
  ProbePage(const ProbePage&) = delete;
  ProbePage& operator=(const ProbePage&) = delete;
  ~ProbePage() { ::munmap(page_, length_); }
  void* address() const { return page_; }
  std::size_t length() const { return length_; }

 private:
  std::size_t length_;
  void* page_ = nullptr;
};

// mbind and move_pages on a page of their own.
std::vector<NumaSystemCallProbe> probe_mbind_and_move_pages() {
  const ProbePage page;
  const long bound = sys_mbind(page.address(), page.length(), MPOL_DEFAULT, nullptr, 0, 0);
  const int bind_error = errno;
  static_cast<volatile char*>(page.address())[0] = 1;  // resident, so move_pages finds a node
  void* pages[] = {page.address()};
  int status = 0;
  const long moved = sys_move_pages(1, pages, nullptr, &status, 0);
  const int move_error = errno;
  return {probe_result("mbind", bound, bind_error), probe_result("move_pages", moved, move_error)};
}

// The probes of the calls placement uses; "" when all are permitted, else why not.
std::string placement_calls_refused() {
  std::vector<NumaSystemCallProbe> probes = probe_mbind_and_move_pages();
  probes.insert(probes.begin(), probe_get_mempolicy());
  std::string reason;
  for (const NumaSystemCallProbe& probe : probes) {
    if (!probe.permitted) reason += (reason.empty() ? "" : "; ") + probe.name + ": " + probe.detail;
  }
  return reason;
}

}  // namespace

std::vector<NumaSystemCallProbe> probe_numa_system_calls() {
  std::vector<NumaSystemCallProbe> probes{probe_get_mempolicy(), probe_set_mempolicy()};
  for (NumaSystemCallProbe& probe : probe_mbind_and_move_pages()) probes.push_back(std::move(probe));
  return probes;
}

bool numa_supported() noexcept {
  try {
    return placement_calls_refused().empty();
  } catch (...) {
    return false;
  }
}

std::string numa_unsupported_reason() {
  const std::string refused = placement_calls_refused();
  return refused.empty() ? "" : "the kernel refuses NUMA system calls here: " + refused;
}

int current_numa_node() {
  unsigned cpu = 0;
  unsigned node = 0;
  if (::syscall(SYS_getcpu, &cpu, &node, nullptr) != 0) throw_system_error("getcpu");
  return static_cast<int>(node);
}

void bind_to_numa_node(const TensorView& view, const char* argument, int node) {
  require_contiguous_host(view, argument);
  require_node_with_memory(node, argument);
  const PageSpan span = page_span_of(view.data, view.nbytes());
  if (span.length == 0) return;
  const NodeMask mask = mask_of(node);
  if (sys_mbind(span.begin, span.length, MPOL_BIND, mask.words(), NodeMask::kernel_max_node(),
                MPOL_MF_MOVE | MPOL_MF_STRICT) != 0) {
    throw_numa_call_error("mbind(MPOL_BIND node " + std::to_string(node) + ", " + std::to_string(span.length) +
                              " bytes, MPOL_MF_MOVE|MPOL_MF_STRICT)",
                          errno);
  }
}

int prefer_local_numa_node(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  const int node = current_numa_node();
  const PageSpan span = page_span_of(view.data, view.nbytes());
  if (span.length == 0) return node;
  const NodeMask mask = mask_of(node);
  if (sys_mbind(span.begin, span.length, MPOL_PREFERRED, mask.words(), NodeMask::kernel_max_node(), 0) != 0) {
    throw_numa_call_error("mbind(MPOL_PREFERRED node " + std::to_string(node) + ", " +
                              std::to_string(span.length) + " bytes)",
                          errno);
  }
  return node;
}

std::vector<int> numa_nodes_of(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  const PageSpan span = page_span_of(view.data, view.nbytes());
  std::vector<int> status(span.page_count(), -EFAULT);
  constexpr std::size_t kPagesPerCall = 65536;
  std::vector<void*> pages;
  for (std::size_t first = 0; first < status.size(); first += kPagesPerCall) {
    const std::size_t count = std::min(kPagesPerCall, status.size() - first);
    pages.resize(count);
    for (std::size_t i = 0; i < count; ++i) pages[i] = span.begin + (first + i) * page_size();
    if (sys_move_pages(count, pages.data(), nullptr, status.data() + first, 0) != 0) {
      throw_numa_call_error("move_pages(query " + std::to_string(count) + " pages)", errno);
    }
  }
  return status;
}

NumaPolicy numa_policy_of(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  if (view.nbytes() == 0) {
    throw InvalidArgument(std::string(argument) + ": an empty tensor covers no pages, got " + view.describe());
  }
  NodeMask mask;
  int mode = 0;
  void* address = page_span_of(view.data, view.nbytes()).begin;
  if (sys_get_mempolicy(&mode, mask.words(), NodeMask::kernel_max_node(), address, MPOL_F_ADDR) != 0) {
    throw_numa_call_error("get_mempolicy(MPOL_F_ADDR)", errno);
  }
  NumaPolicy policy;
  policy.mode = policy_mode_name(mode & ~kPolicyModeFlags);
  for (int node = 0; node < NodeMask::kBits; ++node) {
    if (mask.test(node)) policy.nodes.push_back(node);
  }
  return policy;
}

}  // namespace tensorxfer::memory
