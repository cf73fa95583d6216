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

TEST(TensorViewTest, ShapeProductsThatOverflowThrowInsteadOfWrapping) {
  // 2^62 float32 elements: numel fits int64, numel * 4 bytes does not fit size_t.
  TensorView huge = float_view({int64_t{1} << 62}, {1});
  EXPECT_EQ(huge.numel(), int64_t{1} << 62);
  EXPECT_THROW(huge.nbytes(), InvalidArgument);
  EXPECT_THROW(require_valid_sizes(huge, "x"), InvalidArgument);
  // The product of the extents itself past INT64_MAX.
  TensorView wide = float_view({int64_t{1} << 32, int64_t{1} << 32}, {int64_t{1} << 32, 1});
  EXPECT_THROW(wide.numel(), InvalidArgument);
  EXPECT_FALSE(wide.is_contiguous());
  try {
    require_valid_sizes(wide, "weights");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("weights"), std::string::npos) << error.what();
  }
  EXPECT_THROW(require_valid_sizes(float_view({2, -3}, {1, 1}), "x"), InvalidArgument);
  EXPECT_THROW(require_valid_sizes(float_view({2, 3}, {3}), "x"), InvalidArgument);
  // A zero extent makes any shape empty, however large the others.
  EXPECT_EQ(float_view({0, int64_t{1} << 62, 8}, {1, 1, 1}).nbytes(), 0u);
}

TEST(CheckedArithmeticTest, OverflowThrowsNamingTheQuantity) {
  const std::size_t max = SIZE_MAX;
  EXPECT_EQ(checked_mul(3, 5, "x"), 15u);
  EXPECT_EQ(checked_mul(max, 1, "x"), max);
  EXPECT_THROW(checked_mul(max / 2 + 1, 2, "x"), InvalidArgument);
  EXPECT_EQ(checked_add(max - 1, 1, "x"), max);
  EXPECT_THROW(checked_add(max, 1, "x"), InvalidArgument);
  EXPECT_EQ(checked_round_up(0, 64, "x"), 0u);
  EXPECT_EQ(checked_round_up(65, 64, "x"), 128u);
  EXPECT_EQ(checked_round_up(max - 63, 64, "x"), max - 63);  // already a multiple
  EXPECT_THROW(checked_round_up(max - 1, 64, "x"), InvalidArgument);
  EXPECT_THROW(checked_round_up(max - 1, std::size_t{2} << 20, "x"), InvalidArgument);
  try {
    checked_mul(max, 2, "row bytes * rows");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("row bytes * rows: "), std::string::npos) << error.what();
  }
  const std::vector<int64_t> big{int64_t{1} << 31, int64_t{1} << 31, 4};
  EXPECT_THROW(checked_numel(big, "x"), InvalidArgument);
  EXPECT_EQ(checked_numel(std::vector<int64_t>{}, "x"), 1);
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
