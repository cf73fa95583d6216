// The fake runtime: allocations, copies, host registration, IPC handles, managed memory.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "fake_cuda_state.h"

using namespace tensorxfer::cuda_fake;

namespace {

std::uintptr_t address(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer); }
std::string range_text(const void* pointer, std::size_t bytes) {
  return hex(pointer) + " bytes=" + std::to_string(bytes);
}

// The mapping holding [pointer, pointer + bytes), or nullptr. Caller holds the lock.
Mapping* find_mapping(const void* pointer, std::size_t bytes) {
  auto& memory = state().memory;
  auto found = memory.upper_bound(address(pointer));
  if (found == memory.begin()) return nullptr;
  --found;
  const std::uintptr_t start = found->first;
  if (address(pointer) < start || address(pointer) + bytes > start + found->second.bytes) return nullptr;
  return &found->second;
}

// Whether [pointer, pointer + bytes) lies in one registered host range. Caller holds the lock.
bool is_registered(const void* pointer, std::size_t bytes) {
  auto& registered = state().registered;
  auto found = registered.upper_bound(address(pointer));
  if (found == registered.begin()) return false;
  --found;
  return address(pointer) + bytes <= found->first + found->second;
}

cudaError_t allocate(Entry& entry, void** pointer, std::size_t bytes, MemoryKind kind) {
  if (pointer == nullptr) return entry.finish(cudaErrorInvalidValue);
  *pointer = nullptr;
  if (bytes == 0) return cudaSuccess;
  const int fd = memfd_create("tensorxfer-fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return entry.finish(cudaErrorMemoryAllocation);
  const std::size_t total = kHeaderBytes + bytes;
  void* mapping = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(total)) == 0) {
    mapping = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (mapping == MAP_FAILED) {
    close(fd);
    return entry.finish(cudaErrorMemoryAllocation);
  }
  auto* header = static_cast<SharedHeader*>(mapping);
  header->magic = kHeaderMagic;
  header->bytes = bytes;
  header->imports = 0;
  std::memset(static_cast<char*>(mapping) + kHeaderBytes, 0xA5, bytes);  // not zeroed, as cudaMalloc
  *pointer = static_cast<char*>(mapping) + kHeaderBytes;
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  Mapping& record = state().memory[address(*pointer)];
  record.kind = kind;
  record.bytes = bytes;
  record.device = current_device();
  record.fd = fd;
  record.id = state().next_allocation_id++;
  record.mapping = mapping;
  return cudaSuccess;
}

// Where a copy endpoint lives: true for device-visible fake memory.
bool on_device(const void* pointer, std::size_t bytes) { return find_mapping(pointer, bytes) != nullptr; }

cudaError_t copy(Entry& entry, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return entry.finish(cudaErrorInvalidValue);
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    const bool dst_device = on_device(dst, bytes);
    const bool src_device = on_device(src, bytes);
    const bool dst_host = !dst_device;
    const bool src_host = !src_device;
    bool ok = true;
    switch (kind) {
      case cudaMemcpyHostToDevice: ok = src_host && dst_device; break;
      case cudaMemcpyDeviceToHost: ok = src_device && dst_host; break;
      case cudaMemcpyDeviceToDevice: ok = src_device && dst_device; break;
      case cudaMemcpyHostToHost: ok = src_host && dst_host; break;
      case cudaMemcpyDefault: ok = true; break;
      default: return entry.finish(cudaErrorInvalidMemcpyDirection);
    }
    // A device pointer that is not (wholly) fake memory is what the real runtime rejects.
    if (!ok) return entry.finish(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaMalloc(void** pointer, size_t bytes) {
  Entry entry("cudaMalloc", "bytes=" + std::to_string(bytes), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  return allocate(entry, pointer, bytes, MemoryKind::kDevice);
}

cudaError_t CUDARTAPI cudaMallocManaged(void** pointer, size_t bytes, unsigned int flags) {
  Entry entry("cudaMallocManaged", "bytes=" + std::to_string(bytes) + " flags=" + std::to_string(flags),
              Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) return entry.finish(cudaErrorInvalidValue);
  return allocate(entry, pointer, bytes, MemoryKind::kManaged);
}

cudaError_t CUDARTAPI cudaFree(void* pointer) {
  Entry entry("cudaFree", hex(pointer), Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  if (pointer == nullptr) return cudaSuccess;
  Mapping record;
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    auto found = state().memory.find(address(pointer));
    if (found == state().memory.end() || found->second.kind == MemoryKind::kImported) {
      return entry.finish(cudaErrorInvalidValue);
    }
    record = found->second;
    state().memory.erase(found);
    if (__atomic_load_n(&record.header()->imports, __ATOMIC_ACQUIRE) > 0) ++state().freed_while_imported;
  }
  // The memfd's pages outlive this mapping while an importer has them mapped; the
  // count above is how a test sees that a peer could still be reading them.
  munmap(record.mapping, kHeaderBytes + record.bytes);
  close(record.fd);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset(void* pointer, int value, size_t bytes) {
  Entry entry("cudaMemset", range_text(pointer, bytes) + " value=" + std::to_string(value), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    if (find_mapping(pointer, bytes) == nullptr) return entry.finish(cudaErrorInvalidValue);
  }
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t stream) {
  Entry entry("cudaMemsetAsync", range_text(pointer, bytes) + " value=" + std::to_string(value) +
                                     " stream=" + hex(stream), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    if (find_mapping(pointer, bytes) == nullptr) return entry.finish(cudaErrorInvalidValue);
  }
  std::memset(pointer, value, bytes);  // runs now: in order with everything queued before it
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  Entry entry("cudaMemcpy", "dst=" + hex(dst) + " src=" + hex(src) + " bytes=" + std::to_string(bytes) +
                                " kind=" + std::to_string(static_cast<int>(kind)),
              Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  return copy(entry, dst, src, bytes, kind);
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  Entry entry("cudaMemcpyAsync", "dst=" + hex(dst) + " src=" + hex(src) + " bytes=" + std::to_string(bytes) +
                                     " kind=" + std::to_string(static_cast<int>(kind)) + " stream=" + hex(stream),
              Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  return copy(entry, dst, src, bytes, kind);  // runs now: in order with everything queued before it
}

cudaError_t CUDARTAPI cudaHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  Entry entry("cudaHostRegister", range_text(pointer, bytes) + " flags=" + std::to_string(flags), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (pointer == nullptr || bytes == 0) return entry.finish(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  auto& registered = state().registered;
  // Refuse any overlap with a registered range, as the real runtime does.
  auto next = registered.lower_bound(address(pointer));
  if (next != registered.end() && next->first < address(pointer) + bytes) {
    return entry.finish(cudaErrorHostMemoryAlreadyRegistered);
  }
  if (next != registered.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second > address(pointer)) {
      return entry.finish(cudaErrorHostMemoryAlreadyRegistered);
    }
  }
  registered[address(pointer)] = bytes;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostUnregister(void* pointer) {
  Entry entry("cudaHostUnregister", hex(pointer), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (state().registered.erase(address(pointer)) == 0) return entry.finish(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* pointer) {
  Entry entry("cudaPointerGetAttributes", hex(pointer), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (attributes == nullptr) return entry.finish(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (const Mapping* mapping = find_mapping(pointer, 1)) {
    attributes->type = mapping->kind == MemoryKind::kManaged ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
    attributes->device = mapping->device;
    attributes->devicePointer = const_cast<void*>(pointer);
    attributes->hostPointer = mapping->kind == MemoryKind::kManaged ? const_cast<void*>(pointer) : nullptr;
  } else if (is_registered(pointer, 1)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = const_cast<void*>(pointer);
    attributes->hostPointer = const_cast<void*>(pointer);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* pointer) {
  Entry entry("cudaIpcGetMemHandle", hex(pointer), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (handle == nullptr) return entry.finish(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  auto found = state().memory.find(address(pointer));
  if (found == state().memory.end() || found->second.kind != MemoryKind::kDevice) {
    return entry.finish(cudaErrorInvalidValue);  // only cudaMalloc allocations can be exported
  }
  HandleBytes bytes{kHeaderMagic, static_cast<int>(getpid()), found->second.fd, found->second.id,
                    found->second.bytes};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &bytes, sizeof(bytes));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void** pointer, cudaIpcMemHandle_t handle, unsigned int flags) {
  Entry entry("cudaIpcOpenMemHandle", "flags=" + std::to_string(flags), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  if (pointer == nullptr) return entry.finish(cudaErrorInvalidValue);
  HandleBytes bytes;
  std::memcpy(&bytes, &handle, sizeof(bytes));
  if (bytes.magic != kHeaderMagic) return entry.finish(cudaErrorInvalidResourceHandle);
  if (bytes.pid == static_cast<int>(getpid())) return entry.finish(cudaErrorInvalidResourceHandle);
  {
    // Opening a handle this process already has open returns the same pointer, counted twice.
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    for (auto& [start, mapping] : state().memory) {
      if (mapping.kind == MemoryKind::kImported && mapping.exporter_pid == bytes.pid &&
          mapping.exporter_id == bytes.id) {
        ++mapping.open_count;
        *pointer = reinterpret_cast<void*>(start);
        return cudaSuccess;
      }
    }
  }
  const std::string path = "/proc/" + std::to_string(bytes.pid) + "/fd/" + std::to_string(bytes.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return entry.finish(cudaErrorInvalidResourceHandle);
  void* mapping = mmap(nullptr, kHeaderBytes + bytes.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) return entry.finish(cudaErrorMapBufferObjectFailed);
  auto* header = static_cast<SharedHeader*>(mapping);
  if (header->magic != kHeaderMagic || header->bytes != bytes.bytes) {
    munmap(mapping, kHeaderBytes + bytes.bytes);
    return entry.finish(cudaErrorInvalidResourceHandle);
  }
  __atomic_add_fetch(&header->imports, 1, __ATOMIC_ACQ_REL);
  *pointer = static_cast<char*>(mapping) + kHeaderBytes;
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  Mapping& record = state().memory[address(*pointer)];
  record.kind = MemoryKind::kImported;
  record.bytes = bytes.bytes;
  record.device = current_device();
  record.mapping = mapping;
  record.exporter_pid = bytes.pid;
  record.exporter_id = bytes.id;
  record.open_count = 1;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void* pointer) {
  Entry entry("cudaIpcCloseMemHandle", hex(pointer), Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  Mapping record;
  {
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    auto found = state().memory.find(address(pointer));
    if (found == state().memory.end() || found->second.kind != MemoryKind::kImported) {
      return entry.finish(cudaErrorInvalidResourceHandle);
    }
    if (--found->second.open_count > 0) return cudaSuccess;
    record = found->second;
    state().memory.erase(found);
  }
  __atomic_sub_fetch(&record.header()->imports, 1, __ATOMIC_ACQ_REL);
  munmap(record.mapping, kHeaderBytes + record.bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemPrefetchAsync(const void* pointer, size_t bytes, struct cudaMemLocation location,
                                           unsigned int flags, cudaStream_t stream) {
  Entry entry("cudaMemPrefetchAsync",
              range_text(pointer, bytes) + " location=" + std::to_string(static_cast<int>(location.type)) + ":" +
                  std::to_string(location.id) + " stream=" + hex(stream),
              Needs::kContext);
  TX_FAKE_RETURN_EARLY(entry);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  const Mapping* mapping = find_mapping(pointer, bytes);
  if (mapping == nullptr || mapping->kind != MemoryKind::kManaged) return entry.finish(cudaErrorInvalidValue);
  if (location.type == cudaMemLocationTypeDevice) {
    if (location.id < 0 || location.id >= state().device_count) return entry.finish(cudaErrorInvalidDevice);
    // Devices without concurrent managed access refuse GPU prefetches.
    if (!state().concurrent_managed_access) return entry.finish(cudaErrorInvalidDevice);
  }
  state().managed_requests.push_back({"prefetch", address(pointer), bytes, static_cast<int>(location.type), location.id});
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemAdvise(const void* pointer, size_t bytes, enum cudaMemoryAdvise advice,
                                    struct cudaMemLocation location) {
  Entry entry("cudaMemAdvise",
              range_text(pointer, bytes) + " advice=" + std::to_string(static_cast<int>(advice)) +
                  " location=" + std::to_string(static_cast<int>(location.type)) + ":" + std::to_string(location.id),
              Needs::kContext, true);
  TX_FAKE_RETURN_EARLY(entry);
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  const Mapping* mapping = find_mapping(pointer, bytes);
  if (mapping == nullptr || mapping->kind != MemoryKind::kManaged) return entry.finish(cudaErrorInvalidValue);
  if (location.type == cudaMemLocationTypeDevice && (location.id < 0 || location.id >= state().device_count)) {
    return entry.finish(cudaErrorInvalidDevice);
  }
  const char* name = advice == cudaMemAdviseSetPreferredLocation ? "preferred_location"
                     : advice == cudaMemAdviseSetAccessedBy       ? "accessed_by"
                                                                  : "other_advice";
  state().managed_requests.push_back({name, address(pointer), bytes, static_cast<int>(location.type), location.id});
  return cudaSuccess;
}

}  // extern "C"
