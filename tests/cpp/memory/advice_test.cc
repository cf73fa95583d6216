#include "tensorxfer/memory/advice.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "memory/memory_test_util.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::memory {
namespace {

using testing::FreshMapping;

TEST(PageSpanTest, CoversWholePagesOfTheBytes) {
  const std::size_t page = page_size();
  auto* base = reinterpret_cast<char*>(page * 1000);

  const PageSpan inside = page_span_of(base + 100, 1);
  EXPECT_EQ(inside.begin, base);
  EXPECT_EQ(inside.length, page);
  EXPECT_EQ(inside.page_count(), 1u);

  const PageSpan crossing = page_span_of(base + page - 1, 2);
  EXPECT_EQ(crossing.begin, base);
  EXPECT_EQ(crossing.page_count(), 2u);

  const PageSpan exact = page_span_of(base, 3 * page);
  EXPECT_EQ(exact.begin, base);
  EXPECT_EQ(exact.page_count(), 3u);

  const PageSpan empty = page_span_of(base + 5, 0);
  EXPECT_EQ(empty.length, 0u);
  EXPECT_EQ(empty.page_count(), 0u);
}

TEST(PopulateTest, AutoMakesEveryPageResident) {
  const std::size_t pages = 64;
  FreshMapping mapping(pages * page_size());
  ASSERT_NE(mapping.data(), nullptr);
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  EXPECT_EQ(resident_page_count(view, "tensor"), 0u);

  const PopulateResult result = populate_pages(view, "tensor");
  EXPECT_EQ(result.pages, pages);
  EXPECT_EQ(result.bytes, mapping.size());
  EXPECT_NE(result.method, PopulateMethod::kAuto);  // reports what it really did
  EXPECT_TRUE(result.will_need_hinted);
  EXPECT_EQ(resident_page_count(view, "tensor"), pages);
}

TEST(PopulateTest, TouchKeepsContentsAndPopulatesOnlyCoveredPages) {
  const std::size_t page = page_size();
  FreshMapping mapping(8 * page);
  ASSERT_NE(mapping.data(), nullptr);
  // A view from the middle of page 2 to the middle of page 4 covers pages 2..4.
  unsigned char* first = mapping.data() + 2 * page + page / 2;
  const std::size_t length = 2 * page;
  const TensorView view = TensorView::bytes(first, length);
  // Page 2 (and only page 2) gets a known pattern first.
  std::memset(mapping.data() + 2 * page, 0x5a, page);
  const TensorView whole = TensorView::bytes(mapping.data(), mapping.size());
  ASSERT_EQ(resident_page_count(whole, "whole"), 1u);

  const PopulateResult result = populate_pages(view, "tensor", PopulateMethod::kTouch);
  EXPECT_EQ(result.method, PopulateMethod::kTouch);
  EXPECT_EQ(result.pages, 3u);
  EXPECT_EQ(resident_page_count(whole, "whole"), 3u);
  EXPECT_EQ(resident_page_count(view, "tensor"), 3u);
  for (std::size_t i = 0; i < page; ++i) ASSERT_EQ(mapping.data()[2 * page + i], 0x5a) << "byte " << i;
  for (std::size_t i = 3 * page; i < 5 * page; ++i) ASSERT_EQ(mapping.data()[i], 0) << "byte " << i;
}

TEST(PopulateTest, MadvisePopulateKeepsContents) {
  const std::size_t page = page_size();
  FreshMapping mapping(4 * page);
  ASSERT_NE(mapping.data(), nullptr);
  for (std::size_t i = 0; i < page; ++i) mapping.data()[i] = static_cast<unsigned char>(i * 7);
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  PopulateResult result;
  try {
    result = populate_pages(view, "tensor", PopulateMethod::kMadvisePopulate);
  } catch (const Unsupported& error) {
    GTEST_SKIP() << "kernel without MADV_POPULATE_WRITE: " << error.what();
  }
  EXPECT_EQ(result.method, PopulateMethod::kMadvisePopulate);
  EXPECT_EQ(resident_page_count(view, "tensor"), 4u);
  for (std::size_t i = 0; i < page; ++i) ASSERT_EQ(mapping.data()[i], static_cast<unsigned char>(i * 7));
}

TEST(PopulateTest, ReadOnlyViewOfReadOnlyMappingIsPopulatedByReading) {
  FreshMapping mapping(16 * page_size(), PROT_READ);
  ASSERT_NE(mapping.data(), nullptr);
  TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  view.readonly = true;
  for (PopulateMethod method : {PopulateMethod::kAuto, PopulateMethod::kTouch}) {
    const PopulateResult result = populate_pages(view, "tensor", method);
    EXPECT_EQ(result.pages, 16u) << populate_method_name(method);
  }
}

TEST(PopulateTest, ConcurrentIncrementsSurviveTouching) {
  // A writer increments the first byte of every page (the bytes kTouch touches)
  // while pages are touched; a touch that lost a concurrent update would leave
  // some page behind the writer's round count.
  const std::size_t pages = 256;
  FreshMapping mapping(pages * page_size());
  ASSERT_NE(mapping.data(), nullptr);
  const TensorView view = TensorView::bytes(mapping.data(), mapping.size());
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> rounds{0};  // written by the writer only; read to pace the test
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      for (std::size_t p = 0; p < pages; ++p) {
        __atomic_fetch_add(mapping.data() + p * page_size(), static_cast<unsigned char>(1), __ATOMIC_RELAXED);
      }
      rounds.fetch_add(1, std::memory_order_relaxed);
    }
  });
  // Touch at least 100 times and until the writer has done 100 rounds (bounded by a deadline).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::size_t touches = 0;
  while ((touches < 100 || rounds.load(std::memory_order_relaxed) < 100) &&
         std::chrono::steady_clock::now() < deadline) {
    (void)populate_pages(view, "tensor", PopulateMethod::kTouch);
    ++touches;
  }
  stop.store(true);
  writer.join();
  ASSERT_GE(rounds.load(), 100u);
  ASSERT_GE(touches, 100u);
  for (std::size_t p = 0; p < pages; ++p) {
    ASSERT_EQ(mapping.data()[p * page_size()], static_cast<unsigned char>(rounds.load())) << "page " << p;
  }
}

TEST(PopulateTest, RejectsDeviceAndNonContiguousViewsNamingTheArgument) {
  std::vector<float> data(16);
  TensorView device_view = TensorView::bytes(data.data(), 64, DLDevice{kDLCUDA, 0});
  try {
    (void)populate_pages(device_view, "weights");
    FAIL() << "a CUDA view was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("weights"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("cuda:0"), std::string::npos) << error.what();
  }
  TensorView strided;
  strided.data = data.data();
  strided.dtype = {kDLFloat, 32, 1};
  strided.shape = {4, 2};
  strided.strides = {4, 2};
  EXPECT_THROW((void)populate_pages(strided, "weights"), InvalidArgument);
  EXPECT_THROW((void)resident_page_count(device_view, "weights"), InvalidArgument);
}

TEST(PopulateTest, EmptyViewIsANoOp) {
  std::vector<float> data(1);
  TensorView empty;
  empty.data = data.data();
  empty.dtype = {kDLFloat, 32, 1};
  empty.shape = {0};
  empty.strides = {1};
  const PopulateResult result = populate_pages(empty, "tensor");
  EXPECT_EQ(result.pages, 0u);
  EXPECT_EQ(result.bytes, 0u);
  EXPECT_EQ(resident_page_count(empty, "tensor"), 0u);
}

}  // namespace
}  // namespace tensorxfer::memory
