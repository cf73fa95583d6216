#include "tensorxfer/memory/host_pool.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memory/memory_test_util.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/advice.h"
#include "tensorxfer/memory/numa.h"

namespace tensorxfer::memory {
namespace {

using testing::smaps_field;

bool is_page_aligned(const void* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % page_size() == 0;
}

std::string thp_setting() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(file, text);
  return text;
}

TEST(HostRegionTest, MappedSizeRoundsToPagesOrHugePages) {
  HostRegionOptions plain;
  EXPECT_EQ(HostRegion::mapped_size_for(0, plain), page_size());
  EXPECT_EQ(HostRegion::mapped_size_for(1, plain), page_size());
  EXPECT_EQ(HostRegion::mapped_size_for(page_size() + 1, plain), 2 * page_size());
  HostRegionOptions huge;
  huge.huge_pages = true;
  EXPECT_EQ(HostRegion::mapped_size_for(100, huge), page_size());  // too small for a huge page
  EXPECT_EQ(HostRegion::mapped_size_for(huge_page_size() + 1, huge), 2 * huge_page_size());
}

TEST(HostRegionTest, SizesNearSizeMaxAreRefusedNotWrapped) {
  HostRegionOptions plain;
  HostRegionOptions huge;
  huge.huge_pages = true;
  EXPECT_THROW(HostRegion::mapped_size_for(SIZE_MAX - 1, plain), InvalidArgument);
  EXPECT_THROW(HostRegion::mapped_size_for(SIZE_MAX - 1, huge), InvalidArgument);
  EXPECT_THROW(HostRegion::mapped_size_for(SIZE_MAX - huge_page_size() + 2, huge), InvalidArgument);
  auto pool = HostPool::create(HostPoolOptions{huge});
  EXPECT_THROW(pool->allocate(SIZE_MAX - 1), InvalidArgument);
  EXPECT_EQ(pool->stats().live_blocks, 0u);
}

TEST(HostPoolTest, BlocksArePageAlignedZeroedAndSized) {
  auto pool = HostPool::create({});
  HostBlock block = pool->allocate(10000);
  ASSERT_NE(block.data(), nullptr);
  EXPECT_TRUE(is_page_aligned(block.data()));
  EXPECT_EQ(block.size(), 10000u);
  EXPECT_EQ(block.region().mapped_bytes(), 3 * page_size());
  EXPECT_FALSE(block.reused());
  EXPECT_EQ(resident_page_count(TensorView::bytes(block.data(), block.size()), "block"), 0u)
      << "a fresh block must not be populated (first touch is the caller's)";
  const auto* bytes = static_cast<const unsigned char*>(block.data());
  for (std::size_t i = 0; i < block.size(); ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i;
  const HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.live_blocks, 1u);
  EXPECT_EQ(stats.live_bytes, 3 * page_size());
}

TEST(HostPoolTest, ReleasedBlocksAreReusedForTheSameMappedSize) {
  auto pool = HostPool::create({});
  void* first = nullptr;
  {
    HostBlock block = pool->allocate(5 * page_size());
    first = block.data();
    std::memset(block.data(), 0xab, block.size());
  }
  HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.live_blocks, 0u);
  EXPECT_EQ(stats.cached_blocks, 1u);
  EXPECT_EQ(stats.cached_bytes, 5 * page_size());

  HostBlock other_size = pool->allocate(page_size());
  EXPECT_FALSE(other_size.reused());
  HostBlock again = pool->allocate(5 * page_size() - 10);  // same mapped size
  EXPECT_TRUE(again.reused());
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(static_cast<unsigned char*>(again.data())[0], 0xab);  // stale, as documented
  stats = pool->stats();
  EXPECT_EQ(stats.reused_blocks, 1u);
  EXPECT_EQ(stats.mapped_blocks, 2u);
  EXPECT_EQ(stats.cached_blocks, 0u);
}

TEST(HostPoolTest, CacheLimitIsHonoured) {
  HostPoolOptions options;
  options.max_cached_bytes = 3 * page_size();
  auto pool = HostPool::create(options);
  {
    HostBlock a = pool->allocate(2 * page_size());
    HostBlock b = pool->allocate(2 * page_size());
  }
  const HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.cached_blocks, 1u);
  EXPECT_EQ(stats.cached_bytes, 2 * page_size());
  pool->release_cached();
  EXPECT_EQ(pool->stats().cached_bytes, 0u);
}

TEST(HostPoolTest, BlocksOutliveTheHandleAndClosedPoolsStopCaching) {
  std::vector<HostBlock> blocks;
  std::weak_ptr<HostPool> weak;
  {
    auto pool = HostPool::create({});
    weak = pool;
    blocks.push_back(pool->allocate(page_size()));
    { HostBlock cached = pool->allocate(page_size()); }
    EXPECT_EQ(pool->stats().cached_blocks, 1u);
    pool->close();
    EXPECT_EQ(pool->stats().cached_blocks, 0u);
    EXPECT_THROW((void)pool->allocate(1), InvalidArgument);
  }
  ASSERT_FALSE(weak.expired()) << "a live block keeps its pool";
  std::memset(blocks.front().data(), 1, blocks.front().size());
  blocks.clear();
  EXPECT_TRUE(weak.expired());
}

TEST(HostPoolTest, HugePagesFallBackAndSayWhich) {
  HostPoolOptions options;
  options.region.huge_pages = true;
  auto pool = HostPool::create(options);
  HostBlock small = pool->allocate(page_size());
  EXPECT_EQ(small.region().huge_pages(), HugePages::kNone);
  EXPECT_NE(small.region().huge_pages_note().find("smaller than one huge page"), std::string::npos);

  HostBlock large = pool->allocate(2 * huge_page_size());
  const HugePages kind = large.region().huge_pages();
  EXPECT_NE(kind, HugePages::kNone) << large.region().huge_pages_note();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % huge_page_size(), 0u);
  if (kind == HugePages::kTransparent) {
    EXPECT_NE(large.region().huge_pages_note().find("MAP_HUGETLB"), std::string::npos);
    EXPECT_EQ(smaps_field(large.data(), "THPeligible:"), 1);
    EXPECT_EQ(pool->stats().transparent_blocks, 1u);
  } else {
    EXPECT_EQ(pool->stats().hugetlb_blocks, 1u);
  }
  std::memset(large.data(), 3, large.size());
}

TEST(HostPoolTest, WithoutHugePagesRegionsAreNotThpEligibleInMadviseMode) {
  if (thp_setting().find("[madvise]") == std::string::npos) {
    GTEST_SKIP() << "THP mode is '" << thp_setting() << "', not madvise";
  }
  auto pool = HostPool::create({});
  HostBlock block = pool->allocate(2 * huge_page_size());
  EXPECT_EQ(smaps_field(block.data(), "THPeligible:"), 0);
}

TEST(HostPoolTest, LockedBlocksAreLockedOrSayWhyNot) {
  HostPoolOptions options;
  options.region.lock_pages = true;
  auto pool = HostPool::create(options);
  HostBlock block = pool->allocate(64 * 1024);
  if (block.region().locked()) {
    EXPECT_TRUE(block.region().lock_error().empty());
    EXPECT_EQ(smaps_field(block.data(), "Locked:"), 64);  // kB
    EXPECT_EQ(pool->stats().locked_blocks, 1u);
  } else {
    EXPECT_NE(block.region().lock_error().find("RLIMIT_MEMLOCK"), std::string::npos);
    EXPECT_EQ(pool->stats().lock_failures, 1u);
  }
}

// In a child without CAP_IPC_LOCK and with a 64 KiB RLIMIT_MEMLOCK, locking 1 MiB
// fails; the block is still usable and says why. Exit codes say what went wrong.
int lock_failure_child() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return 10;
  data[CAP_IPC_LOCK / 32].effective &= ~(1U << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &header, data) != 0) return 11;
  rlimit limit{64 * 1024, 64 * 1024};
  if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 12;
  HostPoolOptions options;
  options.region.lock_pages = true;
  auto pool = HostPool::create(options);
  HostBlock block = pool->allocate(1 << 20);
  if (block.region().locked()) return 13;
  if (block.region().lock_error().find("RLIMIT_MEMLOCK soft limit is 65536 bytes") == std::string::npos) return 14;
  if (pool->stats().lock_failures != 1) return 15;
  std::memset(block.data(), 1, block.size());
  return 0;
}

TEST(HostPoolTest, LockFailurePastMemlockLimitIsReportedNotRaised) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(lock_failure_child());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see lock_failure_child for the meaning";
}

TEST(HostPoolTest, NumaNodeOptionIsValidatedAndApplied) {
  if (!numa_supported()) GTEST_SKIP() << numa_unsupported_reason();
  HostPoolOptions bad;
  bad.region.numa_node = 999;
  EXPECT_THROW((void)HostPool::create(bad), InvalidArgument);
  bad.region.numa_node = -5;
  EXPECT_THROW((void)HostPool::create(bad), InvalidArgument);

  const int node = numa_nodes_with_memory().front();
  HostPoolOptions options;
  options.region.numa_node = node;
  auto pool = HostPool::create(options);
  HostBlock block = pool->allocate(16 * page_size());
  std::memset(block.data(), 1, block.size());
  for (int status : numa_nodes_of(TensorView::bytes(block.data(), block.size()), "block")) {
    EXPECT_EQ(status, node);
  }
}

TEST(HostPoolTest, ConcurrentAllocateAndReleaseKeepCountsConsistent) {
  auto pool = HostPool::create({});
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 200; ++i) {
          HostBlock block = pool->allocate(static_cast<std::size_t>((i % 3) + 1) * page_size());
          static_cast<unsigned char*>(block.data())[0] = static_cast<unsigned char>(t);
          if (static_cast<unsigned char*>(block.data())[0] != t) throw std::runtime_error("block shared");
        }
      } catch (const std::exception& error) {
        std::lock_guard<std::mutex> lock(errors_mutex);
        errors.emplace_back(error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(errors.empty()) << errors.front();
  const HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.live_blocks, 0u);
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_EQ(stats.cached_blocks, stats.mapped_blocks) << "every released block fits the cache";
  EXPECT_LE(stats.mapped_blocks, 12u) << "at most 4 threads x 3 sizes are ever live at once";
  EXPECT_EQ(stats.mapped_blocks + stats.reused_blocks, 800u);
}

}  // namespace
}  // namespace tensorxfer::memory
