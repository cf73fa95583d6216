// ctest-labels: concurrent
#include "tensorxfer/copy/pack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::copy {
namespace {

constexpr DLDataType kFloat32{kDLFloat, 32, 1};
constexpr DLDataType kFloat64{kDLFloat, 64, 1};
constexpr DLDataType kUInt8{kDLUInt, 8, 1};
constexpr DLDataType kInt16{kDLInt, 16, 1};
constexpr DLDataType kInt32{kDLInt, 32, 1};
constexpr DLDataType kInt64{kDLInt, 64, 1};

// A host tensor owning its bytes, filled with a per-store pattern.
struct Store {
  DLDataType dtype;
  std::vector<int64_t> shape;  // (N, *row)
  std::vector<uint8_t> bytes;

  Store(DLDataType type, std::vector<int64_t> full_shape, uint32_t seed)
      : dtype(type), shape(std::move(full_shape)) {
    bytes.resize(view().nbytes());
    uint32_t state = seed * 2654435761u + 17;
    for (auto& byte : bytes) {
      state = state * 1664525u + 1013904223u;
      byte = static_cast<uint8_t>(state >> 24);
    }
  }
  TensorView view() {
    TensorView result;
    result.data = bytes.data();
    result.dtype = dtype;
    result.shape = shape;
    result.strides.assign(shape.size(), 1);
    for (std::size_t i = shape.size(); i-- > 1;) result.strides[i - 1] = result.strides[i] * shape[i];
    return result;
  }
};

template <typename Index>
TensorView index_view(std::vector<Index>& indices) {
  TensorView view;
  view.data = indices.data();
  view.dtype = sizeof(Index) == 8 ? kInt64 : kInt32;
  view.shape = {static_cast<int64_t>(indices.size())};
  view.strides = {1};
  return view;
}

// The reference: one memcpy per row, field after field.
std::vector<uint8_t> naive_pack(const PackLayout& layout, std::vector<Store>& stores,
                                const std::vector<int64_t>& indices) {
  std::vector<uint8_t> packed(layout.nbytes(), 0xEE);
  for (std::size_t f = 0; f < layout.fields().size(); ++f) {
    const PackField& field = layout.fields()[f];
    for (std::size_t i = 0; i < indices.size(); ++i) {
      std::memcpy(packed.data() + field.offset + i * field.row_nbytes,
                  stores[f].bytes.data() + indices[i] * field.row_nbytes, field.row_nbytes);
    }
  }
  return packed;
}

TEST(PackLayoutTest, FieldsStartOn64ByteBoundaries) {
  PackLayout layout({{"obs", kFloat32, {64}}, {"action", kFloat32, {8}}, {"reward", kFloat32, {}},
                     {"mask", kUInt8, {3}}, {"done", kUInt8, {}}},
                    5);
  ASSERT_EQ(layout.fields().size(), 5u);
  const auto& f = layout.fields();
  EXPECT_EQ(f[0].name, "obs");
  EXPECT_EQ(f[0].row_nbytes, 256u);
  EXPECT_EQ(f[0].offset, 0u);
  EXPECT_EQ(f[1].offset, 1280u);  // 5 * 256
  EXPECT_EQ(f[1].row_nbytes, 32u);
  EXPECT_EQ(f[2].offset, 1472u);  // 1280 + 160 = 1440 -> 1472
  EXPECT_EQ(f[2].row_nbytes, 4u);
  EXPECT_EQ(f[3].offset, 1536u);  // 1472 + 20 = 1492 -> 1536
  EXPECT_EQ(f[4].offset, 1600u);  // 1536 + 15 = 1551 -> 1600
  EXPECT_EQ(layout.nbytes(), 1664u);  // 1600 + 5 = 1605 -> 1664
  for (const auto& field : f) EXPECT_EQ(field.offset % PackLayout::kAlignment, 0u) << field.name;
  EXPECT_EQ(layout.rows(), 5);
  EXPECT_EQ(layout.find("mask"), &f[3]);
  EXPECT_EQ(layout.find("nope"), nullptr);
}

TEST(PackLayoutTest, EmptyRowsAndZeroRows) {
  PackLayout no_rows({{"a", kFloat32, {4}}, {"b", kFloat32, {}}}, 0);
  EXPECT_EQ(no_rows.nbytes(), 0u);
  PackLayout empty_field({{"a", kFloat32, {0}}, {"b", kUInt8, {}}}, 3);
  EXPECT_EQ(empty_field.fields()[0].row_nbytes, 0u);
  EXPECT_EQ(empty_field.fields()[1].offset, 0u);
  EXPECT_EQ(empty_field.nbytes(), 64u);
}

TEST(PackLayoutTest, SizesThatOverflowAreRefusedNotWrapped) {
  // row bytes = 2^62 * 4 overflows size_t.
  EXPECT_THROW(PackLayout({{"x", kFloat32, {int64_t{1} << 62}}}, 1), InvalidArgument);
  // A product of extents past INT64_MAX.
  EXPECT_THROW(PackLayout({{"x", kUInt8, {int64_t{1} << 32, int64_t{1} << 32}}}, 1), InvalidArgument);
  // row bytes * rows: 4 * (2^63 - 1).
  try {
    PackLayout({{"x", kFloat32, {}}}, INT64_MAX);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("field 'x' row bytes * rows"), std::string::npos) << error.what();
  }
  // Each field fits, but the second one's end offset does not.
  const int64_t half = int64_t{1} << 62;
  EXPECT_THROW(PackLayout({{"a", kUInt8, {}}, {"b", kUInt8, {}}, {"c", kUInt8, {}}, {"d", kUInt8, {}}}, half),
               InvalidArgument);
  // 2 * (2^63 - 1) = SIZE_MAX - 1 bytes fit; rounding them up to 64 does not.
  try {
    PackLayout({{"x", kUInt8, {2}}}, INT64_MAX);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("total bytes"), std::string::npos) << error.what();
  }
}

TEST(PackLayoutTest, RefusesBadSpecs) {
  EXPECT_THROW(PackLayout({}, 4), InvalidArgument);
  EXPECT_THROW(PackLayout({{"a", kFloat32, {}}}, -1), InvalidArgument);
  EXPECT_THROW(PackLayout({{"a", kFloat32, {}}, {"a", kFloat32, {2}}}, 4), InvalidArgument);
  EXPECT_THROW(PackLayout({{"", kFloat32, {}}}, 4), InvalidArgument);
  try {
    PackLayout({{"obs", kFloat32, {4, -2}}}, 4);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("'obs'"), std::string::npos) << error.what();
  }
}

struct GatherCase {
  int64_t rows;
  int64_t store_rows;
  bool with_engine;
  bool wide_indices;
};

class PackGatherTest : public ::testing::TestWithParam<GatherCase> {};

TEST_P(PackGatherTest, MatchesANaiveLoop) {
  const GatherCase c = GetParam();
  PackLayout layout({{"obs", kFloat32, {1024}},   // 4 KiB rows: prefetch path
                     {"act", kFloat64, {3}},      // 24 bytes
                     {"rew", kFloat32, {}},       // 4 bytes
                     {"odd", kUInt8, {5}},        // 5 bytes: unaligned rows
                     {"img", kInt16, {3, 43}}},   // 258 bytes
                    c.rows);
  std::vector<Store> stores;
  uint32_t seed = 1;
  for (const auto& field : layout.fields()) {
    std::vector<int64_t> shape{c.store_rows};
    shape.insert(shape.end(), field.row_shape.begin(), field.row_shape.end());
    stores.emplace_back(field.dtype, shape, seed++);
  }
  std::mt19937_64 random(c.rows);
  std::vector<int64_t> indices(static_cast<std::size_t>(c.rows));
  for (auto& index : indices) index = static_cast<int64_t>(random() % c.store_rows);
  if (!indices.empty()) {
    indices.front() = 0;
    indices.back() = c.store_rows - 1;
  }
  std::vector<PackSource> sources;
  for (std::size_t f = 0; f < stores.size(); ++f) sources.push_back({layout.fields()[f].name, stores[f].view()});
  // Unaligned dst start + slack beyond nbytes that must stay untouched.
  std::vector<uint8_t> buffer(layout.nbytes() + 129, 0xEE);
  CopyEngine engine(2);
  uint8_t* const start = buffer.data() + 1;
  TensorView dst = TensorView::bytes(start, layout.nbytes() + 64);
  if (c.wide_indices) {
    pack_rows(dst, layout, sources, index_view(indices), c.with_engine ? &engine : nullptr);
  } else {
    std::vector<int32_t> narrow(indices.begin(), indices.end());
    pack_rows(dst, layout, sources, index_view(narrow), c.with_engine ? &engine : nullptr);
  }
  const auto expected = naive_pack(layout, stores, indices);
  for (const auto& field : layout.fields()) {
    ASSERT_TRUE(std::equal(start + field.offset, start + field.offset + field.nbytes,
                           expected.begin() + static_cast<std::ptrdiff_t>(field.offset)))
        << "field " << field.name;
  }
  EXPECT_EQ(buffer[0], 0xEE);
  for (std::size_t i = 1 + layout.nbytes(); i < buffer.size(); ++i) ASSERT_EQ(buffer[i], 0xEE) << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, PackGatherTest,
                         ::testing::Values(GatherCase{0, 10, true, true}, GatherCase{1, 1, true, true},
                                           GatherCase{7, 100, false, false},
                                           GatherCase{300, 1000, true, false},
                                           GatherCase{1500, 2500, true, true},  // > 4 MiB: streaming
                                           GatherCase{1500, 2500, false, true}));

class PackErrorsTest : public ::testing::Test {
 protected:
  PackErrorsTest()
      : layout_({{"obs", kFloat32, {4}}, {"rew", kFloat32, {}}}, 3),
        obs_(kFloat32, {10, 4}, 1),
        rew_(kFloat32, {6, 1}, 2),  // reshaped below to (6,)
        buffer_(layout_.nbytes(), 0xAB),
        indices_{1, 2, 3} {
    rew_.shape = {6};
  }

  std::vector<PackSource> sources() { return {{"obs", obs_.view()}, {"rew", rew_.view()}}; }
  TensorView dst() { return TensorView::bytes(buffer_.data(), buffer_.size()); }
  bool dst_untouched() const {
    for (uint8_t byte : buffer_) {
      if (byte != 0xAB) return false;
    }
    return true;
  }
  template <typename Exception>
  std::string error_of(const std::vector<PackSource>& given, TensorView indices, TensorView out) {
    try {
      pack_rows(out, layout_, given, indices, &engine_);
    } catch (const Exception& error) {
      EXPECT_TRUE(dst_untouched());
      return error.what();
    }
    ADD_FAILURE() << "expected an exception";
    return "";
  }

  PackLayout layout_;
  Store obs_, rew_;
  std::vector<uint8_t> buffer_;
  std::vector<int64_t> indices_;
  CopyEngine engine_{2};
};

TEST_F(PackErrorsTest, OutOfRangeIndexIsCaughtBeforeAnyWrite) {
  indices_ = {0, 5, 6};  // 6 is fine for obs (10 rows) but not for rew (6 rows)
  const std::string message = error_of<InvalidArgument>(sources(), index_view(indices_), dst());
  EXPECT_NE(message.find("indices[2] = 6"), std::string::npos) << message;
  EXPECT_NE(message.find("sources['rew'] with 6 rows"), std::string::npos) << message;
  indices_ = {0, -1, 1};
  EXPECT_NE(error_of<InvalidArgument>(sources(), index_view(indices_), dst()).find("indices[1] = -1"),
            std::string::npos);
  std::vector<int32_t> narrow{9, 0, 1};
  EXPECT_NE(error_of<InvalidArgument>(sources(), index_view(narrow), dst()).find("indices[0] = 9"),
            std::string::npos);
}

TEST_F(PackErrorsTest, SourcesMustMatchTheLayout) {
  auto given = sources();
  given.pop_back();
  EXPECT_NE(error_of<InvalidArgument>(given, index_view(indices_), dst()).find("missing field 'rew'"),
            std::string::npos);
  given = sources();
  given.push_back({"extra", rew_.view()});
  EXPECT_NE(error_of<InvalidArgument>(given, index_view(indices_), dst()).find("'extra' is not a field"),
            std::string::npos);
  given = sources();
  given.push_back({"obs", obs_.view()});
  EXPECT_NE(error_of<InvalidArgument>(given, index_view(indices_), dst()).find("'obs' is given twice"),
            std::string::npos);
}

TEST_F(PackErrorsTest, DtypeAndShapeMismatchesNameTheField) {
  Store wrong_dtype(kFloat64, {10, 4}, 3);
  std::vector<PackSource> given{{"obs", wrong_dtype.view()}, {"rew", rew_.view()}};
  const std::string dtype_message = error_of<TypeMismatch>(given, index_view(indices_), dst());
  EXPECT_NE(dtype_message.find("sources['obs']: expected dtype float32, got float64"), std::string::npos)
      << dtype_message;
  Store wrong_shape(kFloat32, {10, 5}, 4);
  given = {{"obs", wrong_shape.view()}, {"rew", rew_.view()}};
  const std::string shape_message = error_of<InvalidArgument>(given, index_view(indices_), dst());
  EXPECT_NE(shape_message.find("sources['obs']: expected shape (N, *(4,)), got (10, 5)"), std::string::npos)
      << shape_message;
  Store scalar_as_column(kFloat32, {6, 1}, 5);
  given = {{"obs", obs_.view()}, {"rew", scalar_as_column.view()}};
  EXPECT_NE(error_of<InvalidArgument>(given, index_view(indices_), dst()).find("sources['rew']"),
            std::string::npos);
}

TEST_F(PackErrorsTest, DstAndIndicesAreChecked) {
  TensorView small = TensorView::bytes(buffer_.data(), layout_.nbytes() - 1);
  EXPECT_NE(error_of<InvalidArgument>(sources(), index_view(indices_), small).find("at least layout.nbytes"),
            std::string::npos);
  TensorView readonly = dst();
  readonly.readonly = true;
  EXPECT_NE(error_of<InvalidArgument>(sources(), index_view(indices_), readonly).find("writable"),
            std::string::npos);
  std::vector<int64_t> too_few{1, 2};
  EXPECT_NE(error_of<InvalidArgument>(sources(), index_view(too_few), dst()).find("expected shape (3,)"),
            std::string::npos);
  std::vector<float> float_indices{1, 2, 3};
  TensorView float_view = TensorView::bytes(float_indices.data(), 12);
  float_view.dtype = kFloat32;
  float_view.shape = {3};
  EXPECT_NE(error_of<TypeMismatch>(sources(), float_view, dst()).find("int32 or int64"), std::string::npos);
}

TEST_F(PackErrorsTest, DstOverlappingASourceIsRefused) {
  TensorView overlapping = TensorView::bytes(obs_.bytes.data(), layout_.nbytes());
  ASSERT_LE(layout_.nbytes(), obs_.bytes.size());
  const auto before = obs_.bytes;
  try {
    pack_rows(overlapping, layout_, sources(), index_view(indices_), nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("dst overlaps sources['obs']"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(before == obs_.bytes);
}

TEST_F(PackErrorsTest, IndicesOverlappingDstAreRefused) {
  // The indices live inside the destination buffer, so the pack would
  // overwrite the very indices it reads.
  auto* inside = reinterpret_cast<int64_t*>(buffer_.data() + layout_.nbytes() - 3 * sizeof(int64_t));
  std::copy(indices_.begin(), indices_.end(), inside);
  TensorView aliased = index_view(indices_);
  aliased.data = inside;
  const std::vector<uint8_t> before = buffer_;
  try {
    pack_rows(dst(), layout_, sources(), aliased, &engine_);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("indices overlap dst"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(before == buffer_) << "nothing may be written";
}

// Another thread flips one index between a valid row and one far outside the
// source (unmapped memory) while the pack runs. pack_rows must read the
// indices once: each call either refuses the bad value or packs valid rows;
// reading the index again after checking it faults (the child dies).
TEST(PackRaceTest, IndicesChangedDuringThePackAreNeverUsedUnchecked) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the race on the caller's indices is what this test makes; TSan reports it by design";
#endif
  const pid_t child = testing::fork_child([]() -> int {
    constexpr int64_t kSourceRows = 64;
    constexpr int64_t kRowFloats = 1024;  // 4 KiB rows
    constexpr int64_t kBatch = 2048;
    std::vector<float> store(kSourceRows * kRowFloats);
    for (int64_t r = 0; r < kSourceRows; ++r) {
      std::fill(store.begin() + r * kRowFloats, store.begin() + (r + 1) * kRowFloats, float(r));
    }
    TensorView source;
    source.data = store.data();
    source.dtype = kFloat32;
    source.shape = {kSourceRows, kRowFloats};
    source.strides = {kRowFloats, 1};
    PackLayout layout({{"x", kFloat32, {kRowFloats}}}, kBatch);
    std::vector<uint8_t> out(layout.nbytes());
    std::vector<int64_t> indices(kBatch);
    for (int64_t i = 0; i < kBatch; ++i) indices[i] = i % kSourceRows;
    int64_t* flipped = &indices[kBatch - 1];  // read last by the gather: long after the check
    const int64_t good = *flipped;
    const int64_t bad = int64_t{1} << 36;  // 2^48 bytes past the store: unmapped
    std::atomic<bool> stop{false};
    std::thread flipper([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        __atomic_store_n(flipped, bad, __ATOMIC_RELAXED);
        for (int spin = 0; spin < 200; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
        __atomic_store_n(flipped, good, __ATOMIC_RELAXED);
        for (int spin = 0; spin < 200; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
      }
    });
    CopyEngine engine(1);
    int refused = 0, packed = 0;
    // At least 400 calls, and on until both outcomes were seen: which one a call gets is up to the
    // scheduler (under load, 400 calls in a row were all refused once), so a fixed count could
    // end before the race was exercised both ways.
    for (int call = 0; call < 5000 && (call < 400 || refused == 0 || packed == 0); ++call) {
      try {
        pack_rows(TensorView::bytes(out.data(), out.size()), layout, {{"x", source}},
                  index_view(indices), &engine);
      } catch (const InvalidArgument&) {
        ++refused;
        continue;
      }
      ++packed;
      const auto* rows = reinterpret_cast<const float*>(out.data());
      for (int64_t i = 0; i < kBatch; ++i) {
        if (rows[i * kRowFloats] != float(i % kSourceRows) ||
            rows[i * kRowFloats + kRowFloats - 1] != float(i % kSourceRows)) {
          stop = true;
          flipper.join();
          return 3;  // a row that is not the checked one
        }
      }
    }
    stop = true;
    flipper.join();
    std::fprintf(stderr, "refused %d, packed %d\n", refused, packed);
    return refused > 0 && packed > 0 ? 0 : 4;
  });
  EXPECT_EQ(testing::wait_exit_code(child), 0)
      << "0: every call refused or packed checked rows; 3: a wrong row; 128+11: read an unchecked index";
}

}  // namespace
}  // namespace tensorxfer::copy
