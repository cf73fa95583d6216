// The fake CUDA runtime itself (builds with -DTENSORXFER_FAKE_CUDA=ON only): the
// semantics the tests of tensorxfer's CUDA paths rely on.
#ifdef TENSORXFER_FAKE_CUDA

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda.h"

namespace {

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { tx_fake_cuda_reset(); }
  void TearDown() override { tx_fake_cuda_reset(); }
};

TEST_F(FakeCudaTest, MallocGivesHostMemoryThatCopiesReachAndFreeReleases) {
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64), cudaSuccess);
  EXPECT_EQ(tx_fake_cuda_live_allocations(), 1u);
  std::vector<char> source(64, 7), back(64, 0);
  ASSERT_EQ(cudaMemcpyAsync(device, source.data(), 64, cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), device, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, source);
  // A host pointer as the device side is refused, as with the real runtime.
  EXPECT_EQ(cudaMemcpy(back.data(), source.data(), 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(tx_fake_cuda_live_allocations(), 0u);
  EXPECT_EQ(cudaFree(device), cudaErrorInvalidValue);
}

TEST_F(FakeCudaTest, HostRegisterRefusesOverlapsWith712AndUnregisterNeedsTheBase) {
  std::vector<char> buffer(4096);
  ASSERT_EQ(cudaHostRegister(buffer.data() + 1024, 1024, 0), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(buffer.data(), 1025, 0), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaHostRegister(buffer.data() + 2047, 10, 0), cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(static_cast<int>(cudaErrorHostMemoryAlreadyRegistered), 712);
  EXPECT_EQ(cudaHostRegister(buffer.data(), 1024, 0), cudaSuccess);  // adjacent, not overlapping
  EXPECT_EQ(tx_fake_cuda_registered_ranges(), 2u);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data() + 1500), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data() + 3000), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaHostUnregister(buffer.data() + 1), cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostUnregister(buffer.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(buffer.data() + 1024), cudaSuccess);
  EXPECT_EQ(tx_fake_cuda_registered_ranges(), 0u);
}

TEST_F(FakeCudaTest, StreamWorkRunsInOrderAndEventsCompleteWhenRecorded) {
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 16), cudaSuccess);
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  const char first[16] = "first", second[16] = "second";
  ASSERT_EQ(cudaMemcpyAsync(device, first, 16, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(device, second, 16, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(nullptr, event, 0), cudaSuccess);
  EXPECT_STREQ(static_cast<const char*>(device), "second");
  ASSERT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(event, stream), cudaErrorInvalidResourceHandle);  // destroyed
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
}

TEST_F(FakeCudaTest, FailuresAreInjectedPerFunctionAfterSkippedCalls) {
  tx_fake_cuda_fail("cudaMalloc", cudaErrorMemoryAllocation, 1, 1);
  void* first = nullptr;
  void* second = nullptr;
  void* third = nullptr;
  EXPECT_EQ(cudaMalloc(&first, 8), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&second, 8), cudaErrorMemoryAllocation);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(cudaMalloc(&third, 8), cudaSuccess);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  cudaFree(first);
  cudaFree(third);
}

TEST_F(FakeCudaTest, AnOldDriverFailsEveryCallButTheVersionQueries) {
  tx_fake_cuda_set_driver_version(12020);
  int count = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInsufficientDriver);
  EXPECT_EQ(count, 0);
  void* pointer = nullptr;
  EXPECT_EQ(cudaMalloc(&pointer, 8), cudaErrorInsufficientDriver);
  int driver = 0;
  EXPECT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  EXPECT_EQ(driver, 12020);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInsufficientDriver), "cudaErrorInsufficientDriver");
}

TEST_F(FakeCudaTest, DeviceCountAndContextsFollowTheSettings) {
  tx_fake_cuda_set_device_count(0);
  int count = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorNoDevice);
  tx_fake_cuda_set_device_count(3);
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(cudaSetDevice(3), cudaErrorInvalidDevice);
  EXPECT_FALSE(tx_fake_cuda_context_created(2));
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  EXPECT_TRUE(tx_fake_cuda_context_created(2));
  EXPECT_FALSE(tx_fake_cuda_context_created(0));
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 2);
  std::thread([] {  // the current device is per thread
    int other = -1;
    EXPECT_EQ(cudaGetDevice(&other), cudaSuccess);
    EXPECT_EQ(other, 0);
  }).join();
}

TEST_F(FakeCudaTest, EveryCallIsLoggedWithArgumentsResultAndThread) {
  void* pointer = nullptr;
  ASSERT_EQ(cudaMalloc(&pointer, 123), cudaSuccess);
  long worker = 0;
  std::thread([&] {
    worker = static_cast<long>(syscall(SYS_gettid));
    (void)cudaFree(pointer);
  }).join();
  const auto calls = tensorxfer::cuda_fake::calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].function, "cudaMalloc");
  EXPECT_EQ(calls[0].arguments, "bytes=123");
  EXPECT_EQ(calls[0].thread, static_cast<long>(syscall(SYS_gettid)));
  EXPECT_EQ(calls[1].function, "cudaFree");
  EXPECT_EQ(calls[1].thread, worker);
  EXPECT_TRUE(calls[1].blocking);
  EXPECT_EQ(calls[1].gil_held, -1);  // no Python here
  EXPECT_LT(calls[0].sequence, calls[1].sequence);
}

TEST_F(FakeCudaTest, ManagedPrefetchAndAdviceAreRecordedAndGpuPrefetchNeedsConcurrentAccess) {
  void* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, 256, cudaMemAttachGlobal), cudaSuccess);
  cudaMemLocation gpu{};
  gpu.type = cudaMemLocationTypeDevice;
  gpu.id = 0;
  ASSERT_EQ(cudaMemPrefetchAsync(managed, 256, gpu, 0, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemAdvise(managed, 128, cudaMemAdviseSetAccessedBy, gpu), cudaSuccess);
  const auto requests = tensorxfer::cuda_fake::managed_requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].kind, "prefetch");
  EXPECT_EQ(requests[1].kind, "accessed_by");
  EXPECT_EQ(requests[1].bytes, 128u);
  tx_fake_cuda_set_concurrent_managed_access(0);
  EXPECT_EQ(cudaMemPrefetchAsync(managed, 256, gpu, 0, nullptr), cudaErrorInvalidDevice);
  std::vector<char> host(256);
  EXPECT_EQ(cudaMemPrefetchAsync(host.data(), 256, gpu, 0, nullptr), cudaErrorInvalidValue);
  cudaFree(managed);
}

TEST_F(FakeCudaTest, IpcHandlesOpenAnotherProcessesMemoryAndCountImports) {
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 4096), cudaSuccess);
  std::memset(device, 0, 4096);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, device), cudaSuccess);
  void* self = nullptr;
  EXPECT_NE(cudaIpcOpenMemHandle(&self, handle, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* opened = nullptr;
    void* again = nullptr;
    int code = 0;
    if (cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) code = 1;
    if (code == 0 && (cudaIpcOpenMemHandle(&again, handle, 0) != cudaSuccess || again != opened)) code = 2;
    if (code == 0 && tx_fake_cuda_open_imports() != 2) code = 3;
    if (code == 0) std::strcpy(static_cast<char*>(opened), "written by the child");
    char byte = 1;
    (void)!write(ready[1], &byte, 1);
    (void)!read(done[0], &byte, 1);
    if (code == 0 && (cudaIpcCloseMemHandle(opened) != cudaSuccess || cudaIpcCloseMemHandle(opened) != cudaSuccess))
      code = 4;
    if (code == 0 && cudaIpcCloseMemHandle(opened) != cudaErrorInvalidResourceHandle) code = 5;
    _exit(code);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  EXPECT_STREQ(static_cast<const char*>(device), "written by the child");
  int status = 0;
  ASSERT_EQ(write(done[1], &byte, 1), 1);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(tx_fake_cuda_freed_while_imported(), 0u);  // the child closed both opens first
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

TEST_F(FakeCudaTest, FreeingMemoryAPeerStillHasOpenIsCounted) {
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 64), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, device), cudaSuccess);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* opened = nullptr;
    const int code = cudaIpcOpenMemHandle(&opened, handle, 0) == cudaSuccess ? 0 : 1;
    char byte = 1;
    (void)!write(ready[1], &byte, 1);
    (void)!read(done[0], &byte, 1);
    _exit(code);
  }
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(tx_fake_cuda_freed_while_imported(), 1u);
  ASSERT_EQ(write(done[1], &byte, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

}  // namespace

#endif  // TENSORXFER_FAKE_CUDA
