// NUMA without libnuma: node discovery from a sysfs tree (several nodes, built in a
// temporary directory, so multi-node parsing is tested on any machine), the
// choice of nodes with memory, the system-call probes, and how each refusal of
// the kernel maps onto the error hierarchy (a seccomp filter in a forked child
// makes one system call fail with a chosen errno).
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "memory/memory_test_util.h"
#include "memory/numa_test_util.h"
#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"
#include "tensorxfer/memory/numa.h"

namespace tensorxfer::memory {
namespace {

using testing::FreshMapping;

// ---- id lists --------------------------------------------------------------------

TEST(NumaIdListTest, ParsesRangesAndSinglesAscending) {
  EXPECT_EQ(parse_numa_id_list("0\n", "online"), std::vector<int>{0});
  EXPECT_EQ(parse_numa_id_list("0-3,8,10-11\n", "cpulist"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_numa_id_list("5,1-2", "x"), (std::vector<int>{1, 2, 5}));
  EXPECT_TRUE(parse_numa_id_list("\n", "cpulist").empty());  // a memory-only node has no CPUs
}

TEST(NumaIdListTest, RefusesMalformedListsNamingTheSource) {
  for (const char* text : {"a", "1-", "-1", "3-1", "1,,2", "1 2", "0-99999999", "99999999999"}) {
    try {
      (void)parse_numa_id_list(text, "node0/cpulist");
      FAIL() << "'" << text << "' was accepted";
    } catch (const InvalidArgument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("node0/cpulist"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string("got '") + text + "'"), std::string::npos) << message;
    }
  }
}

// Random id sets written the way the kernel writes them parse back to the same set.
TEST(NumaIdListTest, RoundTripsRandomSets) {
  std::mt19937 random(13);
  for (int round = 0; round < 500; ++round) {
    std::vector<int> ids;
    for (int id = 0; id < 200; ++id) {
      if (random() % 3 == 0) ids.push_back(id);
    }
    std::string text;
    for (std::size_t i = 0; i < ids.size();) {
      std::size_t j = i;
      while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
      text += (text.empty() ? "" : ",") + std::to_string(ids[i]) + (j > i ? "-" + std::to_string(ids[j]) : "");
      i = j + 1;
    }
    ASSERT_EQ(parse_numa_id_list(text + "\n", "list"), ids) << text;
  }
}

// ---- a fake sysfs tree -------------------------------------------------------------

class FakeSysfs {
 public:
  FakeSysfs() {
    char pattern[] = "/tmp/tensorxfer-numa-test-XXXXXX";
    root_ = ::mkdtemp(pattern) ? pattern : "";
  }
  ~FakeSysfs() {
    std::error_code ignored;
    if (!root_.empty()) std::filesystem::remove_all(root_, ignored);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }
  void write(const std::string& relative, const std::string& text) const {
    const std::filesystem::path path = std::filesystem::path(root_) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void node(int id, const std::string& cpulist, unsigned long long kibibytes) const {
    const std::string directory = "node" + std::to_string(id);
    write(directory + "/cpulist", cpulist + "\n");
    write(directory + "/meminfo", "Node " + std::to_string(id) + " MemTotal:   " + std::to_string(kibibytes) +
                                      " kB\nNode " + std::to_string(id) + " MemFree:   1 kB\n");
  }

 private:
  std::string root_;
};

TEST(NumaTopologyTest, ReadsEveryOnlineNodeOfAMultiNodeTree) {
  FakeSysfs sysfs;
  ASSERT_FALSE(sysfs.root().empty());
  sysfs.write("online", "0-1,3\n");  // node 2 is offline: its directory is not read
  sysfs.node(0, "0-3", 1024);
  sysfs.node(1, "", 2048);        // memory only
  sysfs.node(2, "garbage", 1);    // offline
  sysfs.node(3, "4-7,12", 0);     // CPUs only
  const std::vector<NumaNode> nodes = numa_online_nodes(sysfs.root());
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].id, 0);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(nodes[0].memory_bytes, 1024u * 1024u);
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_TRUE(nodes[1].cpus.empty());
  EXPECT_EQ(nodes[1].memory_bytes, 2048u * 1024u);
  EXPECT_EQ(nodes[2].id, 3);
  EXPECT_EQ(nodes[2].cpus, (std::vector<int>{4, 5, 6, 7, 12}));
  EXPECT_EQ(nodes[2].memory_bytes, 0u);

  EXPECT_EQ(select_nodes_with_memory(nodes, std::nullopt), (std::vector<int>{0, 1}));
  EXPECT_EQ(select_nodes_with_memory(nodes, std::vector<int>{1, 3}), std::vector<int>{1});  // a cpuset
  EXPECT_TRUE(select_nodes_with_memory(nodes, std::vector<int>{3}).empty());
}

TEST(NumaTopologyTest, WithoutSysfsAMachineIsOneNodeOrItsCpuset) {
  EXPECT_TRUE(numa_online_nodes("/nonexistent/tensorxfer/node").empty());
  EXPECT_EQ(select_nodes_with_memory({}, std::nullopt), std::vector<int>{0});
  EXPECT_EQ(select_nodes_with_memory({}, std::vector<int>{2, 5}), (std::vector<int>{2, 5}));
}

TEST(NumaTopologyTest, BrokenTreesRaiseNamingTheFile) {
  FakeSysfs sysfs;
  sysfs.write("online", "0\n");
  EXPECT_THROW((void)numa_online_nodes(sysfs.root()), SystemError);  // node0/ missing
  sysfs.write("node0/cpulist", "0-1\n");
  sysfs.write("node0/meminfo", "Node 0 MemFree: 5 kB\n");
  try {
    (void)numa_online_nodes(sysfs.root());
    FAIL() << "a meminfo without MemTotal was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("node0/meminfo"), std::string::npos) << error.what();
  }
}

TEST(NumaTopologyTest, ThisMachineAgreesWithItsSysfs) {
  const std::string refusal = testing::kernel_numa_refusal();
  const std::vector<int> nodes = numa_nodes_with_memory();
  ASSERT_FALSE(nodes.empty());
  if (!refusal.empty()) GTEST_SKIP() << refusal;
  const int here = current_numa_node();
  bool listed = false;
  for (const NumaNode& node : numa_online_nodes()) {
    if (node.id == here) listed = true;
  }
  EXPECT_TRUE(listed) << "current node " << here << " is not online in sysfs";
}

// ---- probes and refusals -------------------------------------------------------------

TEST(NumaProbeTest, ProbesEveryCallAndAgreesWithNumaSupported) {
  const std::vector<NumaSystemCallProbe> probes = probe_numa_system_calls();
  std::vector<std::string> names;
  for (const NumaSystemCallProbe& probe : probes) {
    names.push_back(probe.name);
    EXPECT_EQ(probe.permitted, probe.error_number == 0) << probe.name;
    EXPECT_EQ(probe.permitted, probe.detail == "ok") << probe.name << ": " << probe.detail;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"get_mempolicy", "set_mempolicy", "mbind", "move_pages"}));
  if (testing::kernel_numa_refusal().empty()) {
    for (const NumaSystemCallProbe& probe : probes) EXPECT_TRUE(probe.permitted) << probe.name << ": " << probe.detail;
    EXPECT_TRUE(numa_supported());
    EXPECT_EQ(numa_unsupported_reason(), "");
  }
}

// Runs `check` in a forked child under a seccomp filter that makes `system_call`
// fail with `error_number`. The child reports a failed expectation through the pipe.
void expect_in_refusing_child(long system_call, int error_number,
                              const std::function<std::string()>& check) {
  if (!testing::kernel_numa_refusal().empty()) GTEST_SKIP() << testing::kernel_numa_refusal();
  testing::NotePipe note;
  const pid_t child = testing::fork_child([&] {
    if (!testing::refuse_system_call(system_call, error_number)) {
      note.send("skip: seccomp filter refused: " + std::string(std::strerror(errno)));
      return 0;
    }
    note.send(check());
    return 0;
  });
  ASSERT_GT(child, 0);
  const std::string result = note.receive();
  EXPECT_EQ(testing::wait_exit_code(child), 0) << result;
  if (result.rfind("skip:", 0) == 0) GTEST_SKIP() << result;
  EXPECT_EQ(result, "ok");
}

std::string message_of(const std::function<void()>& call, int* system_errno, bool* unsupported) {
  try {
    call();
  } catch (const Unsupported& error) {
    *unsupported = true;
    return error.what();
  } catch (const SystemError& error) {
    *system_errno = error.error_number();
    return error.what();
  } catch (const std::exception& error) {
    return std::string("unexpected: ") + error.what();
  }
  return "no error";
}

// The kernel forbidding a call (EPERM, ENOSYS) is Unsupported, naming the call and errno.
std::string expect_unsupported(const std::function<void()>& call, const std::string& name, const std::string& code) {
  int system_errno = 0;
  bool unsupported = false;
  const std::string message = message_of(call, &system_errno, &unsupported);
  if (!unsupported) return "not Unsupported: " + message.substr(0, 80);
  if (message.find(name) == std::string::npos || message.find(code) == std::string::npos) {
    return "missing " + name + "/" + code + ": " + message.substr(0, 80);
  }
  return "ok";
}

// Any other errno is SystemError carrying it.
std::string expect_system_error(const std::function<void()>& call, int error_number) {
  int system_errno = 0;
  bool unsupported = false;
  const std::string message = message_of(call, &system_errno, &unsupported);
  if (system_errno != error_number) return "errno " + std::to_string(system_errno) + ": " + message.substr(0, 80);
  return "ok";
}

TEST(NumaRefusalTest, MbindForbiddenIsUnsupportedAndProbedAsSuch) {
  expect_in_refusing_child(SYS_mbind, EPERM, [] {
    FreshMapping mapping(4 * page_size());
    const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
    const int node = numa_nodes_with_memory().front();
    std::string result = expect_unsupported([&] { bind_to_numa_node(view, "tensor", node); }, "mbind", "EPERM");
    if (result != "ok") return "bind: " + result;
    result = expect_unsupported([&] { (void)prefer_local_numa_node(view, "tensor"); }, "mbind", "EPERM");
    if (result != "ok") return "prefer: " + result;
    if (numa_supported()) return std::string("numa_supported() is true");
    if (numa_unsupported_reason().find("mbind: EPERM") == std::string::npos) return "reason: " + numa_unsupported_reason();
    for (const NumaSystemCallProbe& probe : probe_numa_system_calls()) {
      if (probe.permitted != (probe.name != "mbind")) return "probe " + probe.name + ": " + probe.detail;
      if (probe.name == "mbind" && probe.error_number != EPERM) return "probe errno " + std::to_string(probe.error_number);
    }
    return std::string("ok");
  });
}

TEST(NumaRefusalTest, MovePagesMissingIsUnsupported) {
  expect_in_refusing_child(SYS_move_pages, ENOSYS, [] {
    FreshMapping mapping(2 * page_size());
    const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
    return expect_unsupported([&] { (void)numa_nodes_of(view, "tensor"); }, "move_pages", "ENOSYS");
  });
}

TEST(NumaRefusalTest, OtherMbindFailuresAreSystemErrorsWithTheirErrno) {
  expect_in_refusing_child(SYS_mbind, EIO, [] {
    FreshMapping mapping(2 * page_size());
    const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
    return expect_system_error([&] { bind_to_numa_node(view, "tensor", numa_nodes_with_memory().front()); }, EIO);
  });
}

TEST(NumaRefusalTest, GetMempolicyFailureIsASystemError) {
  expect_in_refusing_child(SYS_get_mempolicy, ENOMEM, [] {
    FreshMapping mapping(page_size());
    const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
    return expect_system_error([&] { (void)numa_policy_of(view, "tensor"); }, ENOMEM);
  });
}

// A real kernel error, no filter: mbind over a range with an unmapped hole is EFAULT.
TEST(NumaRefusalTest, BindOverAnUnmappedHoleIsEfault) {
  if (!testing::kernel_numa_refusal().empty()) GTEST_SKIP() << testing::kernel_numa_refusal();
  // Three pages with the middle one unmapped. The hole is not ours once unmapped: the
  // exception below may have the loader map libstdc++'s thread-local block into it (seen
  // under ASan), so the end unmaps the two outer pages alone, never the whole range.
  struct PagesAroundAHole {
    unsigned char* data = nullptr;
    std::size_t page = page_size();
    PagesAroundAHole() {
      void* mapped = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped == MAP_FAILED) return;
      data = static_cast<unsigned char*>(mapped);
      ::munmap(data + page, page);
    }
    PagesAroundAHole(const PagesAroundAHole&) = delete;
    PagesAroundAHole& operator=(const PagesAroundAHole&) = delete;
    ~PagesAroundAHole() {
      if (data == nullptr) return;
      ::munmap(data, page);
      ::munmap(data + 2 * page, page);
    }
  } mapping;
  ASSERT_NE(mapping.data, nullptr);
  const TensorView view = TensorView::bytes(mapping.data, 3 * mapping.page);
  try {
    bind_to_numa_node(view, "tensor", numa_nodes_with_memory().front());
    FAIL() << "mbind over a hole succeeded";
  } catch (const SystemError& error) {
    EXPECT_EQ(error.error_number(), EFAULT) << error.what();
    EXPECT_NE(std::string(error.what()).find("mbind(MPOL_BIND"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tensorxfer::memory
