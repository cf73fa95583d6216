// NUMA node discovery from sysfs and /proc: no system call, no library.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"
#include "tensorxfer/memory/numa.h"

namespace tensorxfer::memory {
namespace {

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string read_whole_file(const std::string& path) {
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!file.valid()) throw_system_error("open " + path);
  std::string text;
  char chunk[4096];
  for (;;) {
    const ssize_t got = ::read(file.get(), chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_system_error("read " + path);
    if (got == 0) return text;
    text.append(chunk, static_cast<std::size_t>(got));
  }
}

std::string trimmed(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t\n");
  return text.substr(begin, end - begin + 1);
}

// A decimal id in [0, INT_MAX]; false when `text` is anything else.
bool parse_id(const std::string& text, int* id) {
  if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const long long value = std::strtoll(text.c_str(), nullptr, 10);
  if (value > INT_MAX) return false;
  *id = static_cast<int>(value);
  return true;
}

// MemTotal of a node's meminfo ("Node 0 MemTotal:   9922764 kB"), in bytes.
std::uint64_t node_memory_bytes(const std::string& meminfo_path) {
  std::istringstream lines(read_whole_file(meminfo_path));
  std::string line;
  while (std::getline(lines, line)) {
    const auto key = line.find("MemTotal:");
    if (key == std::string::npos) continue;
    std::istringstream value(line.substr(key + 9));
    std::uint64_t kibibytes = 0;
    std::string unit;
    if (!(value >> kibibytes >> unit) || unit != "kB") {
      throw InvalidArgument(meminfo_path + ": expected 'MemTotal: <n> kB', got '" + line + "'");
    }
    return kibibytes * 1024;
  }
  throw InvalidArgument(meminfo_path + ": no MemTotal line");
}

// Mems_allowed_list of /proc/self/status (the cpuset's memory nodes); nullopt when absent.
std::optional<std::vector<int>> allowed_memory_nodes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string key = "Mems_allowed_list:";
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) {
      return parse_numa_id_list(line.substr(key.size()), "/proc/self/status Mems_allowed_list");
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<int> parse_numa_id_list(const std::string& text, const std::string& what) {
  std::vector<int> ids;
  const std::string list = trimmed(text);
  if (list.empty()) return ids;
  std::istringstream ranges(list);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    const auto dash = range.find('-');
    int first = 0;
    int last = 0;
    const bool parsed = dash == std::string::npos
                            ? parse_id(range, &first) && parse_id(range, &last)
                            : parse_id(range.substr(0, dash), &first) && parse_id(range.substr(dash + 1), &last);
    // A list this large is corrupt, not a machine: refuse before allocating it.
    constexpr long long kMostIds = 1 << 16;
    if (!parsed || last < first || static_cast<long long>(last) - first + static_cast<long long>(ids.size()) >= kMostIds) {
      throw InvalidArgument(what + ": expected an id list such as '0-3,8', got '" + list + "'");
    }
    for (int id = first; id <= last; ++id) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<NumaNode> numa_online_nodes(const std::string& root) {
  std::vector<NumaNode> nodes;
  if (!is_directory(root)) return nodes;
  for (int id : parse_numa_id_list(read_whole_file(root + "/online"), root + "/online")) {
    const std::string directory = root + "/node" + std::to_string(id);
    NumaNode node;
    node.id = id;
    node.cpus = parse_numa_id_list(read_whole_file(directory + "/cpulist"), directory + "/cpulist");
    node.memory_bytes = node_memory_bytes(directory + "/meminfo");
    nodes.push_back(std::move(node));
  }
  return nodes;
}

std::vector<int> select_nodes_with_memory(const std::vector<NumaNode>& online,
                                          const std::optional<std::vector<int>>& allowed) {
  if (online.empty()) return allowed && !allowed->empty() ? *allowed : std::vector<int>{0};
  std::vector<int> nodes;
  for (const NumaNode& node : online) {
    const bool in_cpuset = !allowed || std::find(allowed->begin(), allowed->end(), node.id) != allowed->end();
    if (node.memory_bytes > 0 && in_cpuset) nodes.push_back(node.id);
  }
  return nodes;
}

std::vector<int> numa_nodes_with_memory() {
  return select_nodes_with_memory(numa_online_nodes(), allowed_memory_nodes());
}

}  // namespace tensorxfer::memory
