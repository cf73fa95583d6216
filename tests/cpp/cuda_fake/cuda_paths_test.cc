// tensorxfer's CUDA paths against the fake CUDA runtime (builds with
// -DTENSORXFER_FAKE_CUDA=ON only): error mapping, cleanup, device selection, pinning.
#ifdef TENSORXFER_FAKE_CUDA

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "fake_cuda.h"
#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/managed.h"
#include "tensorxfer/runtime/cuda_copy.h"

namespace tensorxfer {
namespace {

using collectives::IpcMemory;
using collectives::MemoryDevice;

class CudaPathsTest : public ::testing::Test {
 protected:
  void SetUp() override { tx_fake_cuda_reset(); }
  void TearDown() override { tx_fake_cuda_reset(); }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The devices the calls of `function` ran with, in order.
std::vector<int> devices_of(const std::string& function) {
  std::vector<int> devices;
  for (const auto& call : cuda_fake::calls()) {
    if (call.function == function) devices.push_back(call.device);
  }
  return devices;
}

// ---- runtime / driver mismatch ------------------------------------------------------
TEST_F(CudaPathsTest, AnOldDriverIsUnsupportedNamingBothVersions) {
  tx_fake_cuda_set_driver_version(12020);
  try {
    (void)runtime::CudaCopySubmitter::create(0);
    FAIL() << "created a submitter on a driver older than the runtime";
  } catch (const Unsupported& error) {
    EXPECT_TRUE(contains(error.what(), "CUDA 12.2") && contains(error.what(), "CUDA 13.0")) << error.what();
  }
  const auto status = memory::managed::cuda_status();
  EXPECT_EQ(status.device_count, 0);
  EXPECT_TRUE(contains(status.reason, "CUDA 12.2") && contains(status.reason, "CUDA 13.0")) << status.reason;
}

TEST_F(CudaPathsTest, SystemNotReadyAndCompatNotSupportedAreUnsupportedToo) {
  for (int error : {802, 804, 35}) {
    tx_fake_cuda_fail("cudaGetDeviceCount", error, 0, 1);
    try {
      (void)runtime::CudaCopySubmitter::create(0);
      FAIL() << "error " << error << " was not reported";
    } catch (const Unsupported& caught) {
      EXPECT_TRUE(contains(caught.what(), "CUDA 13.0")) << caught.what();
    } catch (const Error& caught) {
      ADD_FAILURE() << "error " << error << " became a generic Error: " << caught.what();
    }
  }
}

// ---- IPC lifetime -------------------------------------------------------------------
TEST_F(CudaPathsTest, ConstructionFailingAfterCudaMallocFreesTheAllocation) {
  tx_fake_cuda_fail("cudaIpcGetMemHandle", cudaErrorNotSupported, 0, 1);
  EXPECT_THROW((void)IpcMemory::create_local(0, 2, 256, MemoryDevice::kCuda), Unsupported);
  EXPECT_EQ(tx_fake_cuda_live_allocations(), 0u);
}

// Children play ranks 1..world-1: each makes its region, sends its handle through a
// pipe, and closes once the parent says so. Exit status 0 when nothing went wrong.
struct Peers {
  std::vector<pid_t> pids;
  std::vector<std::string> handles;
  int release[2] = {-1, -1};

  Peers(int world_size, std::size_t nbytes) {
    EXPECT_EQ(pipe(release), 0);
    handles.assign(static_cast<std::size_t>(world_size), "");
    for (int rank = 1; rank < world_size; ++rank) {
      int channel[2];
      EXPECT_EQ(pipe(channel), 0);
      const pid_t pid = fork();
      if (pid == 0) {
        int code = 0;
        {
          IpcMemory memory = IpcMemory::create_local(rank, world_size, nbytes, MemoryDevice::kCuda);
          const std::string& handle = memory.local_handle();
          code = write(channel[1], handle.data(), handle.size()) == static_cast<ssize_t>(handle.size()) ? 0 : 1;
          char byte = 0;
          (void)!read(release[0], &byte, 1);
        }
        if (code == 0 && tx_fake_cuda_freed_while_imported() != 0) code = 2;
        _exit(code);
      }
      pids.push_back(pid);
      std::string handle(sizeof(cudaIpcMemHandle_t), '\0');
      EXPECT_EQ(read(channel[0], handle.data(), handle.size()), static_cast<ssize_t>(handle.size()));
      handles[static_cast<std::size_t>(rank)] = handle;
      close(channel[0]);
      close(channel[1]);
    }
  }
  // Lets the children close and checks how they exited.
  void finish() {
    const std::string bytes(pids.size(), 'x');
    EXPECT_EQ(write(release[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    for (pid_t pid : pids) {
      int status = 0;
      EXPECT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer status " << status;
    }
    close(release[0]);
    close(release[1]);
  }
};

TEST_F(CudaPathsTest, MappingAgainAfterAPartialFailureOpensNoHandleTwice) {
  Peers peers(3, 128);
  IpcMemory memory = IpcMemory::create_local(0, 3, 128, MemoryDevice::kCuda);
  std::vector<std::string> handles = peers.handles;
  handles[0] = memory.local_handle();
  tx_fake_cuda_fail("cudaIpcOpenMemHandle", cudaErrorMapBufferObjectFailed, 1, 1);  // rank 2's open fails
  EXPECT_THROW(memory.map_peers(handles), Error);
  EXPECT_EQ(tx_fake_cuda_open_imports(), 1u);
  memory.map_peers(handles);
  EXPECT_EQ(tx_fake_cuda_open_imports(), 2u) << "a handle was opened twice";
  memory.close();
  EXPECT_EQ(tx_fake_cuda_open_imports(), 0u);
  EXPECT_EQ(tx_fake_cuda_live_allocations(), 0u);
  peers.finish();
}

// ---- device selection ---------------------------------------------------------------
TEST_F(CudaPathsTest, IpcMemoryKeepsItsDeviceForEveryLaterCallOnAnyThread) {
  tx_fake_cuda_set_device_count(2);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  IpcMemory memory = IpcMemory::create_local(0, 1, 64, MemoryDevice::kCuda);
  memory.map_peers({memory.local_handle()});
  std::thread([&] { memory.close(); }).join();  // a thread that never chose a device
  EXPECT_EQ(devices_of("cudaMalloc"), std::vector<int>{1});
  EXPECT_EQ(devices_of("cudaFree"), std::vector<int>{1});
  EXPECT_FALSE(tx_fake_cuda_context_created(0)) << "a context was created on GPU 0";
}

TEST_F(CudaPathsTest, DeviceGuardsCreateNoContextOnGpu0ForWorkOnGpu1) {
  tx_fake_cuda_set_device_count(2);
  std::thread([] {
    runtime::CudaCopySubmitter submitter = runtime::CudaCopySubmitter::create(1);
    void* device = nullptr;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&device, 16), cudaSuccess);
    const char host[16] = "bytes";
    submitter.copy_host_to_device(device, host, sizeof(host), nullptr);
    cudaFree(device);
  }).join();
  EXPECT_FALSE(tx_fake_cuda_context_created(0)) << "a context was created on GPU 0";
  // A thread whose device 0 is in use gets it back.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  (void)runtime::CudaCopySubmitter::create(1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

// ---- pinning ------------------------------------------------------------------------
TEST_F(CudaPathsTest, RegisteringChecksTheWholeRangeAndClearsTheErrorItCaused) {
  tx_fake_cuda_set_device_count(2);
  std::vector<char> buffer(8192);
  EXPECT_TRUE(runtime::register_host_memory(buffer.data(), 4096, 1));
  EXPECT_FALSE(runtime::register_host_memory(buffer.data(), 4096, 1));  // already pinned: nothing to undo
  EXPECT_THROW(runtime::register_host_memory(buffer.data() + 2048, 4096, 1), InvalidArgument);
  tx_fake_cuda_fail("cudaHostRegister", cudaErrorNotSupported, 0, 1);
  EXPECT_THROW(runtime::register_host_memory(buffer.data() + 4096, 4096, 1), Unsupported);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << "the failed registration left the runtime's error set";
  std::thread([&] { runtime::unregister_host_memory(buffer.data(), 1); }).join();
  EXPECT_EQ(devices_of("cudaHostUnregister"), std::vector<int>{1});
  EXPECT_EQ(devices_of("cudaHostRegister"), (std::vector<int>{1, 1}));
  EXPECT_EQ(tx_fake_cuda_registered_ranges(), 0u);
}

// ---- managed memory -----------------------------------------------------------------
TEST_F(CudaPathsTest, GpuPrefetchWithoutConcurrentManagedAccessIsUnsupported) {
  void* managed = memory::managed::allocate(4096, 0);
  ASSERT_NE(managed, nullptr);
  memory::managed::prefetch(managed, 4096, 0, nullptr);
  tx_fake_cuda_set_concurrent_managed_access(0);
  try {
    memory::managed::prefetch(managed, 4096, 0, nullptr);
    FAIL() << "prefetched to a GPU without concurrent managed access";
  } catch (const Unsupported& error) {
    EXPECT_TRUE(contains(error.what(), "concurrent managed access")) << error.what();
  }
  memory::managed::prefetch(managed, 4096, memory::managed::kCpuDeviceId, nullptr);  // the CPU still works
  const auto requests = cuda_fake::managed_requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].location_type, static_cast<int>(cudaMemLocationTypeHost));
  EXPECT_EQ(memory::managed::release(managed), "");
}

}  // namespace
}  // namespace tensorxfer

#endif  // TENSORXFER_FAKE_CUDA
