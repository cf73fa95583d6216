#include "tensorxfer/common/tensor_view.h"

#include <gtest/gtest.h>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer {
namespace {

TensorView float_view(std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView view;
  view.dtype = {kDLFloat, 32, 1};
  view.shape = std::move(shape);
  view.strides = std::move(strides);
  return view;
}

TEST(TensorViewTest, ContiguityIgnoresUnitDimensions) {
  EXPECT_TRUE(float_view({2, 3}, {3, 1}).is_contiguous());
  EXPECT_FALSE(float_view({2, 3}, {1, 2}).is_contiguous());
  EXPECT_TRUE(float_view({2, 1, 3}, {3, 99, 1}).is_contiguous());
  EXPECT_TRUE(float_view({}, {}).is_contiguous());
}

TEST(TensorViewTest, SizesFollowDtypeAndShape) {
  const TensorView view = float_view({4, 5}, {5, 1});
  EXPECT_EQ(view.element_size(), 4u);
  EXPECT_EQ(view.numel(), 20);
  EXPECT_EQ(view.nbytes(), 80u);
  EXPECT_EQ(view.describe(), "shape=(4, 5) strides=(5, 1) dtype=float32 device=cpu:0");
}

TEST(TensorViewTest, DtypeNamesRoundTrip) {
  for (const char* name : {"bool", "uint8", "int64", "float16", "bfloat16", "float64", "complex128"}) {
    EXPECT_EQ(dtype_name(dtype_from_name(name)), name);
  }
  EXPECT_THROW(dtype_from_name("float8"), TypeMismatch);
}

TEST(TensorViewTest, RequirementsNameTheArgument) {
  TensorView strided = float_view({2, 3}, {1, 2});
  try {
    require_contiguous(strided, "dst");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("dst must be C-contiguous, got shape=(2, 3) strides=(1, 2)"),
              std::string::npos);
  }
  TensorView device_view = float_view({2}, {1});
  device_view.device = {kDLCUDA, 1};
  EXPECT_THROW(require_host(device_view, "src"), InvalidArgument);
  device_view.readonly = true;
  EXPECT_THROW(require_writable(device_view, "dst"), InvalidArgument);
}

TEST(CheckTest, ComparisonMessagePrintsBothValues) {
  const int depth = 0;
  try {
    TENSORXFER_CHECK_GE(InvalidArgument, "SlotRing::create", depth, 1);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "SlotRing::create: expected depth >= 1, got depth=0, 1=1");
  }
}

TEST(ErrorTest, SystemErrorCarriesErrno) {
  const SystemError error("shm_open(/x)", ENOENT);
  EXPECT_EQ(error.error_number(), ENOENT);
  EXPECT_NE(std::string(error.what()).find("errno 2"), std::string::npos);
}

}  // namespace
}  // namespace tensorxfer
