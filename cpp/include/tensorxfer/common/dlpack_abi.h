// tensorxfer's own declaration of the DLPack C ABI (DLPack 1.0), written from the
// public specification (https://dmlc.github.io/dlpack/latest/c_api.html) so the
// project builds where no dlpack/dlpack.h is installed. Include
// "tensorxfer/common/dlpack.h", not this file: it picks the system header when that
// one declares DLPack >= 1.0 and this declaration otherwise.
//
// The names, field order and values are the specification's; only the namespace is
// ours, so that one translation unit can hold this declaration beside the system
// header and check that the two agree (tests/cpp/common/dlpack_abi_test.cc).
//
// What the ABI promises (and the core relies on):
// - DLTensor describes memory it does not own: data + byte_offset is the first
//   element, shape/strides have ndim entries, strides are in elements and may be
//   null (C-contiguous).
// - DLManagedTensor (legacy, PyCapsule name "dltensor") and DLManagedTensorVersioned
//   (DLPack >= 1.0, capsule "dltensor_versioned") own the producer's tensor: the
//   consumer calls deleter(self) exactly once when done (deleter may be null).
// - A versioned tensor whose version.major differs from kMajorVersion has an unknown
//   layout after `deleter`: only the deleter may be called. A different minor version
//   adds enumerators only.
// - flags & kFlagReadOnly: the consumer must not write the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tensorxfer::dlpack_abi {

// The ABI version this declaration describes.
inline constexpr uint32_t kMajorVersion = 1;
inline constexpr uint32_t kMinorVersion = 0;

// Bits of DLManagedTensorVersioned::flags.
inline constexpr uint64_t kFlagReadOnly = uint64_t{1} << 0;  // the consumer must not write
inline constexpr uint64_t kFlagIsCopied = uint64_t{1} << 1;  // the producer made a private copy

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// Where a tensor's memory lives. Values are fixed by the specification (gaps are
// retired device types).
enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // page-locked host memory from cudaMallocHost
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,  // page-locked host memory from hipMallocHost
  kDLExtDev = 12,
  kDLCUDAManaged = 13,  // cudaMallocManaged memory, usable from host and device
  kDLOneAPI = 14,       // SYCL / Intel XPU
  kDLWebGPU = 15,
  kDLHexagon = 16,
};

struct DLDevice {
  DLDeviceType device_type;
  int32_t device_id;  // the device's ordinal; 0 for the CPU
};

// DLDataType::code values.
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,  // bits covers both parts: complex64 is {kDLComplex, 64, 1}
  kDLBool = 6,
};

struct DLDataType {
  uint8_t code;    // a DLDataTypeCode
  uint8_t bits;    // bits of one lane
  uint16_t lanes;  // 1 for scalars, > 1 for vector types
};

struct DLTensor {
  void* data;  // for some devices an opaque handle; add byte_offset before use
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;    // ndim entries
  int64_t* strides;  // ndim entries in elements, or null for C-contiguous
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;  // the producer's; the consumer never reads it
  void (*deleter)(DLManagedTensor* self);
};

// The fields up to and including `deleter` keep their place in every future major
// version, so that a consumer can always release a tensor it cannot read.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;  // kFlagReadOnly | kFlagIsCopied
  DLTensor dl_tensor;
};

// Layout checks: these structs are read from memory another library wrote.
static_assert(std::is_trivially_copyable_v<DLTensor> && std::is_standard_layout_v<DLTensor>);
static_assert(std::is_trivially_copyable_v<DLManagedTensorVersioned> &&
              std::is_standard_layout_v<DLManagedTensorVersioned>);
static_assert(sizeof(DLPackVersion) == 8);
static_assert(sizeof(DLDeviceType) == 4 && sizeof(DLDevice) == 8);
static_assert(sizeof(DLDataTypeCode) == 1);
static_assert(sizeof(DLDataType) == 4 && alignof(DLDataType) == 2);
static_assert(offsetof(DLManagedTensor, dl_tensor) == 0);
static_assert(offsetof(DLManagedTensorVersioned, version) == 0);
#if UINTPTR_MAX == UINT64_MAX  // the offsets on the 64-bit platforms tensorxfer builds for
static_assert(offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40);
static_assert(sizeof(DLTensor) == 48 && alignof(DLTensor) == 8);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 &&
              offsetof(DLManagedTensor, deleter) == 56 && sizeof(DLManagedTensor) == 64);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
              offsetof(DLManagedTensorVersioned, deleter) == 16 &&
              offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32 &&
              sizeof(DLManagedTensorVersioned) == 80);
#endif

}  // namespace tensorxfer::dlpack_abi
