#include "tensorxfer/runtime/cuda_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/managed.h"

#ifdef TENSORXFER_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tensorxfer::runtime {
namespace {

bool has_gpu() { return memory::managed::cuda_status().device_count > 0; }

TEST(CudaCopySubmitterTest, CompiledExactlyWithCuda) {
#ifdef TENSORXFER_WITH_CUDA
  EXPECT_TRUE(kCudaCopyCompiled);
#else
  EXPECT_FALSE(kCudaCopyCompiled);
  EXPECT_EQ(cuda_runtime_calls(), 0u);
#endif
}

#ifdef TENSORXFER_WITH_CUDA

TEST(CudaCopySubmitterTest, NegativeDeviceIsRefusedWithoutCallingCuda) {
  const std::uint64_t before = cuda_runtime_calls();
  try {
    (void)CudaCopySubmitter::create(-1);
    FAIL() << "device -1 was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("a GPU id >= 0, got -1"), std::string::npos) << error.what();
  }
  EXPECT_EQ(cuda_runtime_calls(), before);
}

TEST(CudaCopySubmitterTest, WithoutADeviceCreationSaysWhyAndIsCounted) {
  if (has_gpu()) GTEST_SKIP() << "a CUDA device is present";
  const std::uint64_t before = cuda_runtime_calls();
  try {
    (void)CudaCopySubmitter::create(0);
    FAIL() << "created a submitter without a device";
  } catch (const Unsupported& error) {
    EXPECT_NE(std::string(error.what()).find("cudaGetDeviceCount"), std::string::npos) << error.what();
  }
  EXPECT_GT(cuda_runtime_calls(), before);
}

TEST(CudaCopySubmitterTest, CopiesHostBytesAfterTheWaitedStream) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device: " << memory::managed::cuda_status().reason;
  CudaCopySubmitter submitter = CudaCopySubmitter::create(0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  constexpr std::size_t kBytes = 1 << 20;
  std::vector<std::uint8_t> host(kBytes), back(kBytes, 0);
  for (std::size_t i = 0; i < kBytes; ++i) host[i] = static_cast<std::uint8_t>(i * 7);
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  cudaStream_t copy_stream = nullptr, caller_stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&copy_stream), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&caller_stream), cudaSuccess);
  // The caller's stream still writes the destination; the copy must land after it.
  ASSERT_EQ(cudaMemsetAsync(device, 0xAB, kBytes, caller_stream), cudaSuccess);
  submitter.order_after(copy_stream, caller_stream);
  submitter.copy_host_to_device(device, host.data(), kBytes, copy_stream);
  ASSERT_EQ(cudaStreamSynchronize(copy_stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), device, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  submitter.copy_host_to_device(device, host.data(), 0, copy_stream);  // zero bytes: no-op
  EXPECT_THROW(submitter.copy_host_to_device(nullptr, host.data(), 16, copy_stream), InvalidArgument);
  cudaStreamDestroy(copy_stream);
  cudaStreamDestroy(caller_stream);
  cudaFree(device);
}

#endif  // TENSORXFER_WITH_CUDA

}  // namespace
}  // namespace tensorxfer::runtime
