#include "tensorxfer/common/tensor_view.h"

#include <sstream>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer {
namespace {

struct NamedDtype {
  const char* name;
  DLDataType dtype;
};

constexpr NamedDtype kNamedDtypes[] = {
    {"bool", {kDtypeCodeBool, 8, 1}},        {"uint8", {kDLUInt, 8, 1}},
    {"uint16", {kDLUInt, 16, 1}},     {"uint32", {kDLUInt, 32, 1}},
    {"uint64", {kDLUInt, 64, 1}},     {"int8", {kDLInt, 8, 1}},
    {"int16", {kDLInt, 16, 1}},       {"int32", {kDLInt, 32, 1}},
    {"int64", {kDLInt, 64, 1}},       {"float16", {kDLFloat, 16, 1}},
    {"float32", {kDLFloat, 32, 1}},   {"float64", {kDLFloat, 64, 1}},
    {"bfloat16", {kDLBfloat, 16, 1}}, {"complex64", {kDLComplex, 64, 1}},
    {"complex128", {kDLComplex, 128, 1}},
};

template <typename Values>
std::string tuple_text(const Values& values) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < values.size(); ++i) {
    out << (i ? ", " : "") << values[i];
  }
  if (values.size() == 1) out << ',';
  out << ')';
  return out.str();
}

}  // namespace

bool operator==(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

std::string dtype_name(DLDataType dtype) {
  for (const auto& named : kNamedDtypes) {
    if (named.dtype == dtype) return named.name;
  }
  std::ostringstream out;
  out << "dtype(code=" << int(dtype.code) << ",bits=" << int(dtype.bits)
      << ",lanes=" << dtype.lanes << ')';
  return out.str();
}

DLDataType dtype_from_name(const std::string& name) {
  for (const auto& named : kNamedDtypes) {
    if (name == named.name) return named.dtype;
  }
  throw TypeMismatch("unknown dtype '" + name +
                     "': expected one of bool, uint8..uint64, int8..int64, float16, "
                     "bfloat16, float32, float64, complex64, complex128");
}

std::string device_name(DLDevice device) {
  const char* type = "unknown";
  switch (static_cast<int>(device.device_type)) {
    case kDLCPU: type = "cpu"; break;
    case kDLCUDA: type = "cuda"; break;
    case kDLCUDAHost: type = "cuda_host"; break;
    case kDLCUDAManaged: type = "cuda_managed"; break;
    case kDLROCM: type = "rocm"; break;
    case kDLROCMHost: type = "rocm_host"; break;
    case kDeviceTypeOneAPI: type = "xpu"; break;
    case kDLMetal: type = "mps"; break;
    default: break;
  }
  return std::string(type) + ":" + std::to_string(device.device_id);
}

std::size_t TensorView::element_size() const {
  return (static_cast<std::size_t>(dtype.bits) * dtype.lanes + 7) / 8;
}

int64_t TensorView::numel() const { return checked_numel(shape, "tensor view"); }

std::size_t TensorView::nbytes() const {
  return checked_mul(static_cast<std::size_t>(numel()), element_size(), "tensor view bytes");
}

bool TensorView::is_contiguous() const {
  if (strides.size() != shape.size()) return false;
  int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    // A product past INT64_MAX describes no real tensor: not contiguous.
    if (__builtin_mul_overflow(expected, shape[i], &expected)) return false;
  }
  return true;
}

bool TensorView::is_host() const {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
    case kDLROCMHost:
    case kDLCUDAManaged:
      return true;
    default:
      return false;
  }
}

std::string TensorView::describe() const {
  std::ostringstream out;
  out << "shape=" << tuple_text(shape) << " strides=" << tuple_text(strides)
      << " dtype=" << dtype_name(dtype) << " device=" << device_name(device);
  return out.str();
}

TensorView TensorView::bytes(void* data, std::size_t nbytes, DLDevice device) {
  TensorView view;
  view.data = data;
  view.device = device;
  view.shape = {static_cast<int64_t>(nbytes)};
  view.strides = {1};
  return view;
}

void require_valid_sizes(const TensorView& view, const std::string& argument) {
  if (view.strides.size() != view.shape.size()) {
    throw InvalidArgument(argument + ": " + std::to_string(view.shape.size()) + " extents but " +
                          std::to_string(view.strides.size()) + " strides");
  }
  const int64_t count = checked_numel(view.shape, argument.c_str());
  TENSORXFER_CHECK(InvalidArgument, view.element_size() > 0, argument, ": element size 0 (",
                   dtype_name(view.dtype), ")");
  checked_mul(static_cast<std::size_t>(count), view.element_size(),
              (argument + ": numel * itemsize").c_str());
}

void require_contiguous(const TensorView& view, const char* argument) {
  if (!view.is_contiguous()) {
    throw InvalidArgument(std::string(argument) + " must be C-contiguous, got " + view.describe() +
                          " (call .contiguous() / numpy.ascontiguousarray first)");
  }
}

void require_host(const TensorView& view, const char* argument) {
  if (!view.is_host()) {
    throw InvalidArgument(std::string(argument) + " must be in host memory (device cpu), got " +
                          view.describe());
  }
}

void require_writable(const TensorView& view, const char* argument) {
  if (view.readonly) {
    throw InvalidArgument(std::string(argument) + " must be writable, got a read-only " +
                          view.describe());
  }
}

void require_contiguous_host(const TensorView& view, const char* argument) {
  require_host(view, argument);
  require_contiguous(view, argument);
}

}  // namespace tensorxfer
