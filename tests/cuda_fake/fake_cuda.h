// A fake CUDA runtime for tests on machines without a GPU: it defines the CUDA
// runtime functions tensorxfer calls (fake_cuda_device.cc, fake_cuda_memory.cc)
// with host semantics, and a control API (this header) that tests use to set
// the machine it pretends to be, to make calls fail, and to read what was called.
//
// Linked in place of libcudart by -DTENSORXFER_FAKE_CUDA=ON (CMakeLists.txt):
// the core's CUDA files, the ctest binaries and a separate build of the
// extension (tensorxfer._core.fake_cuda exposes this API to Python).
//
// Semantics:
// - cudaMalloc / cudaMallocManaged return host memory (a memfd mapping, so an
//   IPC handle can be opened by another process through /proc/<pid>/fd).
// - Work "queued" on a stream runs when it is queued, so streams run their work
//   in order and an event completes as soon as it is recorded.
// - cudaHostRegister tracks ranges and refuses overlaps (712); unregistering a
//   pointer that is not a registered base fails (713).
// - A driver version below the runtime's (CUDART_VERSION) makes every call that
//   needs the driver return cudaErrorInsufficientDriver (35), as the real one does.
// - Blocking calls (cudaDeviceSynchronize, cudaMemcpy, cudaFree, cudaMemAdvise,
//   cudaStreamSynchronize, cudaEventSynchronize) check whether the calling
//   thread holds the Python GIL (PyGILState_Check found with dlsym, when a
//   Python interpreter is running); a call made with the GIL held is counted.
// - Every call is logged: sequence number, function, arguments, result, thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" {

// Back to a fresh machine: one device, driver = runtime version, concurrent
// managed access, no failures, empty log, nothing allocated is forgotten
// (live allocations stay valid). The calling thread's current device becomes 0.
void tx_fake_cuda_reset(void);
void tx_fake_cuda_set_device_count(int count);
void tx_fake_cuda_set_driver_version(int version);
void tx_fake_cuda_set_concurrent_managed_access(int enabled);
// The next `times` calls of `function` (a cuda* name) after `skip` more calls
// return `error` (times < 0: every call from then on). Replaces an earlier rule.
void tx_fake_cuda_fail(const char* function, int error, int skip, int times);
// Blocking calls made while the calling thread held the GIL, so far.
std::uint64_t tx_fake_cuda_gil_violations(void);
// cudaFree of an allocation that another process still had open through IPC.
std::uint64_t tx_fake_cuda_freed_while_imported(void);
// Handles this process has open through cudaIpcOpenMemHandle (each open counted).
std::uint64_t tx_fake_cuda_open_imports(void);
// Live cudaMalloc + cudaMallocManaged allocations of this process.
std::uint64_t tx_fake_cuda_live_allocations(void);
// Registered host ranges of this process.
std::uint64_t tx_fake_cuda_registered_ranges(void);
// Whether a primary context exists on `device` (created by cudaSetDevice or
// by any call that needs a context while `device` is current).
int tx_fake_cuda_context_created(int device);

}  // extern "C"

namespace tensorxfer::cuda_fake {

struct Call {
  std::uint64_t sequence = 0;
  std::string function;
  std::string arguments;
  int result = 0;
  long thread = 0;  // gettid() of the caller
  int device = 0;   // the caller's current device
  bool blocking = false;
  int gil_held = -1;  // blocking calls with Python running: 1 held, 0 released; else -1
};

// A copy of the log since the last reset.
std::vector<Call> calls();

// What cudaMemPrefetchAsync / cudaMemAdvise were asked (kind "prefetch" or the advice name).
struct ManagedRequest {
  std::string kind;
  std::uintptr_t pointer = 0;
  std::size_t bytes = 0;
  int location_type = 0;  // cudaMemLocationType
  int location_id = 0;
};
std::vector<ManagedRequest> managed_requests();

}  // namespace tensorxfer::cuda_fake
