// The fake runtime: errors, versions, devices, streams, events, driver entry points.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "fake_cuda_state.h"

using namespace tensorxfer::cuda_fake;

namespace {

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* message;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemNotReady, "cudaErrorSystemNotReady", "system not yet initialized"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch",
     "system has unsupported display driver / cuda driver combination"},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice",
     "forward compatibility was attempted on non supported HW"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "mapping of buffer object failed"},
};

const ErrorText* find_error(cudaError_t error) {
  for (const ErrorText& entry : kErrors) {
    if (entry.error == error) return &entry;
  }
  return nullptr;
}

bool valid_device(int device) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return device >= 0 && device < state().device_count;
}

// The fake driver's cuDevicePrimaryCtxGetState: whether the primary context of `device` is active.
CUresult fake_primary_context_state(CUdevice device, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = tx_fake_cuda_context_created(device);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  Entry entry("cudaGetErrorName", std::to_string(static_cast<int>(error)), Needs::kNothing);
  entry.finish(cudaSuccess);
  const ErrorText* text = find_error(error);
  return text != nullptr ? text->name : "cudaErrorUnknown";
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  Entry entry("cudaGetErrorString", std::to_string(static_cast<int>(error)), Needs::kNothing);
  entry.finish(cudaSuccess);
  const ErrorText* text = find_error(error);
  return text != nullptr ? text->message : "unrecognized error code";
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  Entry entry("cudaGetLastError", "", Needs::kNothing);
  const cudaError_t error = take_last_error(true);
  entry.finish(cudaSuccess);
  return error;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  Entry entry("cudaPeekAtLastError", "", Needs::kNothing);
  entry.finish(cudaSuccess);
  return take_last_error(false);
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  Entry entry("cudaDriverGetVersion", "", Needs::kNothing);
  TX_FAKE_RETURN_EARLY(entry);
  if (version == nullptr) return entry.finish(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  *version = state().driver_version;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  Entry entry("cudaRuntimeGetVersion", "", Needs::kNothing);
  TX_FAKE_RETURN_EARLY(entry);
  if (version == nullptr) return entry.finish(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  Entry entry("cudaGetDeviceCount", "", Needs::kDriver);
  if (count != nullptr) *count = 0;
  TX_FAKE_RETURN_EARLY(entry);
  if (count == nullptr) return entry.finish(cudaErrorInvalidValue);
  int devices = 0;
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    devices = state().device_count;
  }
  if (devices == 0) return entry.finish(cudaErrorNoDevice);
  *count = devices;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  Entry entry("cudaGetDevice", "", Needs::kDriver);
  TX_FAKE_RETURN_EARLY(entry);
  if (device == nullptr) return entry.finish(cudaErrorInvalidValue);
  *device = current_device();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  // Since CUDA 12 cudaSetDevice initialises the device's primary context.
  Entry entry("cudaSetDevice", std::to_string(device), Needs::kDriver);
  TX_FAKE_RETURN_EARLY(entry);
  if (!valid_device(device)) return entry.finish(cudaErrorInvalidDevice);
  current_device() = device;
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().contexts[static_cast<std::size_t>(device)] = true;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attribute, int device) {
  Entry entry("cudaDeviceGetAttribute",
              "attribute=" + std::to_string(static_cast<int>(attribute)) + " device=" + std::to_string(device),
              Needs::kDriver);
  TX_FAKE_RETURN_EARLY(entry);
  if (value == nullptr) return entry.finish(cudaErrorInvalidValue);
  if (!valid_device(device)) return entry.finish(cudaErrorInvalidDevice);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  switch (attribute) {
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrManagedMemory:
      *value = state().concurrent_managed_access || attribute == cudaDevAttrManagedMemory ? 1 : 0;
      return cudaSuccess;
    default:
      *value = 0;
      return cudaSuccess;
  }
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  Entry entry("cudaDeviceSynchronize", "", Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  return cudaSuccess;  // work ran when it was queued
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* stream) {
  Entry entry("cudaStreamCreate", "", Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (stream == nullptr) return entry.finish(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new char(0));
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().streams[reinterpret_cast<std::uintptr_t>(*stream)] = current_device();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  Entry entry("cudaStreamDestroy", hex(stream), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (state().streams.erase(reinterpret_cast<std::uintptr_t>(stream)) == 0) {
    return entry.finish(cudaErrorInvalidResourceHandle);
  }
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  Entry entry("cudaStreamSynchronize", hex(stream), Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Entry entry("cudaEventCreateWithFlags", "flags=" + std::to_string(flags), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (event == nullptr) return entry.finish(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(new char(0));
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().events[reinterpret_cast<std::uintptr_t>(*event)] = current_device();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  Entry entry("cudaEventDestroy", hex(event), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (state().events.erase(reinterpret_cast<std::uintptr_t>(event)) == 0) {
    return entry.finish(cudaErrorInvalidResourceHandle);
  }
  delete reinterpret_cast<char*>(event);
  return cudaSuccess;
}

// An event recorded on stream S completes when S's earlier work has: at once here.
static cudaError_t check_event(Entry& entry, cudaEvent_t event, bool same_device) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  auto found = state().events.find(reinterpret_cast<std::uintptr_t>(event));
  if (found == state().events.end()) return entry.finish(cudaErrorInvalidResourceHandle);
  // Recording an event of another device than the current one is an error in CUDA.
  if (same_device && found->second != current_device()) return entry.finish(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Entry entry("cudaEventRecord", hex(event) + " stream=" + hex(stream), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  return check_event(entry, event, true);
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  Entry entry("cudaEventQuery", hex(event), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  return check_event(entry, event, false);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  Entry entry("cudaEventSynchronize", hex(event), Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  return check_event(entry, event, false);
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Entry entry("cudaStreamWaitEvent", "stream=" + hex(stream) + " " + hex(event), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  return check_event(entry, event, false);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int version,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult* status) {
  Entry entry("cudaGetDriverEntryPointByVersion", symbol != nullptr ? symbol : "(null)", Needs::kDriver);
  TX_FAKE_RETURN_EARLY(entry);
  if (symbol == nullptr || function == nullptr) return entry.finish(cudaErrorInvalidValue);
  const bool known = std::strcmp(symbol, "cuDevicePrimaryCtxGetState") == 0;
  *function = known ? reinterpret_cast<void*>(&fake_primary_context_state) : nullptr;
  if (status != nullptr) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

}  // extern "C"
