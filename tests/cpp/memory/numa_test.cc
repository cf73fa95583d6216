#include "tensorxfer/memory/numa.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "memory/memory_test_util.h"
#include "memory/numa_test_util.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"

namespace tensorxfer::memory {
namespace {

using testing::FreshMapping;

// Runs wherever the kernel has NUMA and no seccomp filter stands in the way: there
// the placement calls must work (no library is needed), so a refusal fails the test.
class NumaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string refusal = testing::kernel_numa_refusal();
    if (!refusal.empty()) GTEST_SKIP() << refusal;
    ASSERT_TRUE(numa_supported()) << numa_unsupported_reason();
    nodes_ = numa_nodes_with_memory();
    ASSERT_FALSE(nodes_.empty());
  }
  std::vector<int> nodes_;
};

TEST_F(NumaTest, CurrentNodeHasMemory) {
  const int node = current_numa_node();
  bool listed = false;
  for (int candidate : nodes_) listed = listed || candidate == node;
  EXPECT_TRUE(listed) << "current node " << node;
}

TEST_F(NumaTest, UntouchedPagesAreReportedAbsentAndTouchedOnesByNode) {
  const std::size_t page = page_size();
  FreshMapping mapping(8 * page);
  ASSERT_NE(mapping.data(), nullptr);
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  std::memset(mapping.data() + 3 * page, 1, 2 * page);  // pages 3 and 4 only
  const std::vector<int> status = numa_nodes_of(view, "tensor");
  ASSERT_EQ(status.size(), 8u);
  for (std::size_t i = 0; i < status.size(); ++i) {
    if (i == 3 || i == 4) {
      EXPECT_GE(status[i], 0) << "page " << i;
    } else {
      EXPECT_EQ(status[i], -ENOENT) << "page " << i;
    }
  }
}

TEST_F(NumaTest, BindPlacesEveryPageOnTheNode) {
  for (int node : nodes_) {
    const std::size_t pages = 32;
    FreshMapping mapping(pages * page_size());
    ASSERT_NE(mapping.data(), nullptr);
    const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
    std::memset(mapping.data(), 7, mapping.size() / 2);  // half resident before the bind (moved)
    bind_to_numa_node(view, "tensor", node);
    std::memset(mapping.data(), 9, mapping.size());  // the rest faults in under the policy
    const std::vector<int> status = numa_nodes_of(view, "tensor");
    ASSERT_EQ(status.size(), pages);
    for (std::size_t i = 0; i < pages; ++i) EXPECT_EQ(status[i], node) << "page " << i;
    const NumaPolicy policy = numa_policy_of(view, "tensor");
    EXPECT_EQ(policy.mode, "bind");
    EXPECT_EQ(policy.nodes, std::vector<int>{node});
  }
}

TEST_F(NumaTest, RefusesNodesWithoutMemoryListingTheValidOnes) {
  FreshMapping mapping(page_size());
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  const int beyond = nodes_.back() + 1;
  for (int node : {-2, -1, beyond, 999}) {
    try {
      bind_to_numa_node(view, "weights", node);
      FAIL() << "node " << node << " was accepted";
    } catch (const InvalidArgument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("weights"), std::string::npos) << message;
      EXPECT_NE(message.find("got " + std::to_string(node)), std::string::npos) << message;
      EXPECT_NE(message.find("[" + std::to_string(nodes_.front())), std::string::npos) << message;
    }
  }
  EXPECT_EQ(numa_policy_of(view, "weights").mode, "default");  // nothing was applied
}

TEST_F(NumaTest, PreferLocalSetsAPreferredPolicyOnTheCurrentNode) {
  FreshMapping mapping(4 * page_size());
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  EXPECT_EQ(numa_policy_of(view, "tensor").mode, "default");
  const int node = prefer_local_numa_node(view, "tensor");
  const NumaPolicy policy = numa_policy_of(view, "tensor");
  EXPECT_EQ(policy.mode, "preferred");
  EXPECT_EQ(policy.nodes, std::vector<int>{node});
}

TEST_F(NumaTest, EmptyViewIsANoOpAndDeviceViewIsRefused) {
  std::vector<float> data(4);
  TensorView empty = TensorView::bytes(data.data(), 0);
  EXPECT_TRUE(numa_nodes_of(empty, "tensor").empty());
  bind_to_numa_node(empty, "tensor", nodes_.front());
  EXPECT_THROW(bind_to_numa_node(empty, "tensor", 999), InvalidArgument);  // still validated
  EXPECT_THROW((void)numa_policy_of(empty, "tensor"), InvalidArgument);
  const TensorView device = TensorView::bytes(data.data(), 16, DLDevice{kDLCUDA, 0});
  EXPECT_THROW((void)numa_nodes_of(device, "tensor"), InvalidArgument);
  EXPECT_THROW(bind_to_numa_node(device, "tensor", nodes_.front()), InvalidArgument);
  EXPECT_THROW((void)prefer_local_numa_node(device, "tensor"), InvalidArgument);
}

}  // namespace
}  // namespace tensorxfer::memory
