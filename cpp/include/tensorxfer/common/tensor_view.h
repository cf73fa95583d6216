// A non-owning description of a tensor's memory: pointer, byte size, dtype,
// shape, strides (in elements) and device. Views are made from numpy arrays,
// torch tensors and any DLPack / buffer-protocol object in one place (the
// bindings' make_view, called from python/tensorxfer/_tensor.py); the core
// never owns the memory a view points at: the caller keeps it alive.
#pragma once

#include "tensorxfer/common/dlpack.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tensorxfer {

// Codes newer than the dlpack.h shipped by Debian 12 (DLPack 0.6); values from DLPack >= 0.8.
inline constexpr uint8_t kDtypeCodeBool = 6;          // DLDataTypeCode kDLBool
inline constexpr int kDeviceTypeOneAPI = 14;          // DLDeviceType kDLOneAPI

struct TensorView {
  void* data = nullptr;
  DLDataType dtype{kDLUInt, 8, 1};
  DLDevice device{kDLCPU, 0};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; same length as shape
  bool readonly = false;

  // Bytes of one element (dtype bits * lanes / 8).
  std::size_t element_size() const;
  // The product of the extents; InvalidArgument for a negative extent or a
  // product past INT64_MAX (never a wrapped count).
  int64_t numel() const;
  // numel() * element_size(): the bytes a contiguous tensor of this shape
  // covers; InvalidArgument when that does not fit in size_t.
  std::size_t nbytes() const;
  // C-contiguous (row-major, dense); size-1 dimensions may have any stride.
  bool is_contiguous() const;
  bool is_host() const;  // kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged
  // "shape=(4, 8) strides=(8, 1) dtype=float32 device=cpu:0"
  std::string describe() const;

  // A contiguous uint8 view over raw bytes.
  static TensorView bytes(void* data, std::size_t nbytes, DLDevice device = {kDLCPU, 0});
};

// "float32", "int64", "bool", "bfloat16", ... ("dtype(code=7,bits=8,lanes=1)" if unnamed).
std::string dtype_name(DLDataType dtype);
// The inverse of dtype_name for the names it produces; throws TypeMismatch otherwise.
DLDataType dtype_from_name(const std::string& name);
bool operator==(DLDataType a, DLDataType b);
inline bool operator!=(DLDataType a, DLDataType b) { return !(a == b); }
// "cpu:0", "cuda:1", "rocm:0", ...
std::string device_name(DLDevice device);

// Contracts on arguments; each throws with `argument` named in the message and
// the view described, saying what was expected.
// Views built from outside input (DLPack, buffers) pass this first: one stride
// per extent, extents >= 0, a non-zero element size and numel * element size
// within size_t (InvalidArgument otherwise).
void require_valid_sizes(const TensorView& view, const std::string& argument);
void require_contiguous(const TensorView& view, const char* argument);  // InvalidArgument
void require_host(const TensorView& view, const char* argument);        // InvalidArgument
void require_writable(const TensorView& view, const char* argument);    // InvalidArgument
void require_contiguous_host(const TensorView& view, const char* argument);

}  // namespace tensorxfer
