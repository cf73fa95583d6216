#include "tensorxfer/memory/managed.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensorxfer/common/error.h"

namespace tensorxfer::memory::managed {
namespace {

bool has_gpu() { return cuda_status().device_count > 0; }

TEST(CudaStatusTest, IsConsistent) {
  const CudaStatus status = cuda_status();
#ifdef TENSORXFER_WITH_CUDA
  EXPECT_TRUE(status.compiled);
  EXPECT_GE(status.runtime_version, 10000);
#else
  EXPECT_FALSE(status.compiled);
  EXPECT_NE(status.reason.find("no CUDA"), std::string::npos) << status.reason;
#endif
  if (status.device_count == 0) {
    EXPECT_FALSE(status.reason.empty());
  } else {
    EXPECT_TRUE(status.reason.empty()) << status.reason;
  }
}

TEST(ManagedArgumentsTest, InvalidDeviceIdsAreRejectedEverywhere) {
  std::vector<float> host(4);
  EXPECT_THROW(prefetch(host.data(), 16, -2, nullptr), InvalidArgument);
  EXPECT_THROW(advise_preferred_location(host.data(), 16, -7), InvalidArgument);
  try {
    advise_accessed_by(host.data(), 16, kCpuDeviceId);
    FAIL() << "accessed-by accepted the CPU";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("a GPU id >= 0, got -1"), std::string::npos) << error.what();
  }
  // Even for empty ranges the id is checked; the work is skipped.
  EXPECT_THROW(advise_accessed_by(host.data(), 0, -1), InvalidArgument);
  prefetch(host.data(), 0, kCpuDeviceId, nullptr);
  advise_preferred_location(host.data(), 0, 0);
}

TEST(ManagedArgumentsTest, HostPointersAreNotManaged) {
  std::vector<float> host(4);
  EXPECT_FALSE(is_managed_pointer(host.data()));
  EXPECT_FALSE(is_managed_pointer(nullptr));
  EXPECT_EQ(release(nullptr), "");
  EXPECT_EQ(allocate(0, 0), nullptr);
}

TEST(ManagedWithoutGpuTest, EveryCallSaysWhyItIsUnsupported) {
  if (has_gpu()) GTEST_SKIP() << "a CUDA device is present; see ManagedOnGpuTest";
  const std::string reason = cuda_status().reason;
  ASSERT_FALSE(reason.empty());
  std::vector<float> host(1024);
  auto expect_unsupported = [&](auto&& call, const char* name) {
    try {
      call();
      ADD_FAILURE() << name << " succeeded without a GPU";
    } catch (const Unsupported& error) {
      EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << name << ": " << error.what();
    }
  };
  expect_unsupported([&] { (void)allocate(4096, 0); }, "allocate");
  expect_unsupported([&] { prefetch(host.data(), 4096, 0, nullptr); }, "prefetch to GPU");
  expect_unsupported([&] { prefetch(host.data(), 4096, kCpuDeviceId, nullptr); }, "prefetch to CPU");
  expect_unsupported([&] { advise_preferred_location(host.data(), 4096, 0); }, "preferred location");
  expect_unsupported([&] { advise_accessed_by(host.data(), 4096, 0); }, "accessed by");
  expect_unsupported([&] { (void)concurrent_managed_access(0); }, "concurrent managed access");
  expect_unsupported([&] { require_gpu(0, "test"); }, "require_gpu");
}

TEST(ManagedOnGpuTest, AllocatePrefetchAdviseAndFree) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda_status().reason;
  void* pointer = allocate(1 << 20, 0);
  ASSERT_NE(pointer, nullptr);
  EXPECT_TRUE(is_managed_pointer(pointer));
  advise_preferred_location(pointer, 1 << 20, kCpuDeviceId);
  advise_accessed_by(pointer, 1 << 20, 0);
  if (concurrent_managed_access(0)) {
    prefetch(pointer, 1 << 20, 0, nullptr);
    prefetch(pointer, 1 << 20, kCpuDeviceId, nullptr);
  }
  std::vector<float> host(4);
  EXPECT_THROW(prefetch(host.data(), 16, 0, nullptr), InvalidArgument);
  EXPECT_THROW(require_gpu(cuda_status().device_count, "test"), InvalidArgument);
  EXPECT_EQ(release(pointer), "");
}

}  // namespace
}  // namespace tensorxfer::memory::managed
