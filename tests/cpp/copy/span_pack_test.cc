// ctest-labels: concurrent
#include "tensorxfer/copy/span_pack.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::copy {
namespace {

std::vector<uint8_t> pattern(std::size_t nbytes, uint32_t seed) {
  std::vector<uint8_t> bytes(nbytes);
  uint32_t state = seed * 2654435761u + 1;
  for (auto& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<uint8_t>(state >> 24);
  }
  return bytes;
}

// Sizes mixing empty, odd, small and multi-piece spans.
std::vector<std::size_t> mixed_sizes(std::size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<std::size_t> sizes(count);
  for (std::size_t i = 0; i < count; ++i) {
    switch (random() % 5) {
      case 0: sizes[i] = 0; break;
      case 1: sizes[i] = 1 + random() % 7; break;
      case 2: sizes[i] = 4096; break;
      case 3: sizes[i] = 1 + random() % 100000; break;
      default: sizes[i] = (std::size_t{1} << 20) + random() % 1000; break;  // several pieces
    }
  }
  return sizes;
}

struct Spans {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::size_t> sizes;
  std::size_t total = 0;

  Spans(const std::vector<std::size_t>& span_sizes, uint32_t seed) : sizes(span_sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      buffers.push_back(pattern(sizes[i], seed + static_cast<uint32_t>(i)));
      total += sizes[i];
    }
  }
  std::vector<const void*> sources() const {
    std::vector<const void*> result;
    for (const auto& buffer : buffers) result.push_back(buffer.data());
    return result;
  }
  std::vector<void*> destinations() {
    std::vector<void*> result;
    for (auto& buffer : buffers) result.push_back(buffer.data());
    return result;
  }
};

void round_trip(CopyEngine* engine, std::size_t count, uint32_t seed) {
  Spans in(mixed_sizes(count, seed), seed);
  std::vector<uint8_t> packed(in.total + 3, 0xEE);  // spare bytes must stay untouched
  pack_spans(packed.data(), packed.size(), in.sources(), in.sizes, engine);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_TRUE(std::equal(in.buffers[i].begin(), in.buffers[i].end(), packed.begin() + offset))
        << "span " << i << " packed at offset " << offset;
    offset += in.sizes[i];
  }
  for (std::size_t i = in.total; i < packed.size(); ++i) ASSERT_EQ(packed[i], 0xEE) << "byte " << i;

  Spans out(in.sizes, seed + 1000);  // different contents, same sizes
  unpack_spans(packed.data(), packed.size(), out.destinations(), out.sizes, engine);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(out.buffers[i], in.buffers[i]) << "span " << i;
}

TEST(SpanPack, RoundTripOnCallerThread) { round_trip(nullptr, 40, 1); }

TEST(SpanPack, RoundTripOnEngineThreads) {
  CopyEngine engine(2);
  round_trip(&engine, 40, 2);
  round_trip(&engine, 3, 3);
}

TEST(SpanPack, ManySmallSpans) {
  CopyEngine engine(2);
  Spans in(std::vector<std::size_t>(10000, 4096), 7);
  std::vector<uint8_t> packed(in.total);
  pack_spans(packed.data(), packed.size(), in.sources(), in.sizes, &engine);
  Spans out(in.sizes, 9);
  unpack_spans(packed.data(), packed.size(), out.destinations(), out.sizes, &engine);
  for (std::size_t i = 0; i < in.sizes.size(); ++i) ASSERT_EQ(out.buffers[i], in.buffers[i]) << "span " << i;
}

TEST(SpanPack, LargeTotalUsesStreamingAndStaysCorrect) {
  CopyEngine engine(2);
  Spans in({std::size_t{9} << 20, 5, std::size_t{1} << 20}, 11);  // > streaming threshold
  std::vector<uint8_t> packed(in.total);
  pack_spans(packed.data(), packed.size(), in.sources(), in.sizes, &engine);
  Spans out(in.sizes, 12);
  unpack_spans(packed.data(), packed.size(), out.destinations(), out.sizes, &engine);
  for (std::size_t i = 0; i < in.sizes.size(); ++i) ASSERT_EQ(out.buffers[i], in.buffers[i]) << "span " << i;
}

TEST(SpanPack, CopySpansCopiesEachPair) {
  CopyEngine engine(2);
  Spans in(mixed_sizes(25, 21), 21);
  Spans out(in.sizes, 22);
  std::vector<Span> spans;
  for (std::size_t i = 0; i < in.sizes.size(); ++i) {
    spans.push_back({reinterpret_cast<const std::byte*>(in.buffers[i].data()),
                     reinterpret_cast<std::byte*>(out.buffers[i].data()), in.sizes[i]});
  }
  copy_spans(spans, &engine);
  for (std::size_t i = 0; i < in.sizes.size(); ++i) ASSERT_EQ(out.buffers[i], in.buffers[i]) << "span " << i;
}

TEST(SpanPack, EmptyListAndZeroByteSpansAreNoOps) {
  pack_spans(nullptr, 0, {}, {}, nullptr);
  pack_spans(nullptr, 0, {nullptr, nullptr}, {0, 0}, nullptr);
  unpack_spans(nullptr, 0, {nullptr}, {0}, nullptr);
  copy_spans(std::vector<Span>{{nullptr, nullptr, 0}}, nullptr);
  copy_spans(nullptr, 0, nullptr);
}

TEST(SpanPack, DestinationTooSmallIsRejectedBeforeWriting) {
  std::vector<uint8_t> a(10, 1), b(10, 2), packed(19, 0);
  try {
    pack_spans(packed.data(), packed.size(), {a.data(), b.data()}, {10, 10}, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("dst holds 19 bytes, the 2 spans need 20"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(packed, std::vector<uint8_t>(19, 0));
  EXPECT_THROW(unpack_spans(packed.data(), packed.size(), {a.data(), b.data()}, {10, 10}, nullptr),
               InvalidArgument);
}

TEST(SpanPack, NullAddressWithBytesIsRejected) {
  std::vector<uint8_t> packed(8);
  try {
    pack_spans(packed.data(), packed.size(), {nullptr}, {8}, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("span 0: null address for 8 bytes"), std::string::npos)
        << error.what();
  }
}

TEST(SpanPack, OverlapWithThePackedBufferIsRejected) {
  std::vector<uint8_t> buffer(64, 3);
  // The packed range is [0, total): a source inside it, or a destination inside the packed source.
  EXPECT_THROW(pack_spans(buffer.data(), 32, {buffer.data() + 4}, {8}, nullptr), InvalidArgument);
  EXPECT_THROW(unpack_spans(buffer.data(), 32, {buffer.data() + 8}, {16}, nullptr), InvalidArgument);
  auto* bytes = reinterpret_cast<std::byte*>(buffer.data());
  EXPECT_THROW(copy_spans(std::vector<Span>{{bytes + 4, bytes, 8}}, nullptr), InvalidArgument);
  // Adjacent, not overlapping: fine.
  pack_spans(buffer.data(), 32, {buffer.data() + 32}, {32}, nullptr);
}

TEST(SpanPack, SizeOverflowIsRejected) {
  const std::size_t huge = std::numeric_limits<std::size_t>::max() - 4;
  try {
    (void)packed_nbytes({8, huge});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("overflow"), std::string::npos) << error.what();
  }
  uint8_t byte = 0;
  EXPECT_THROW(pack_spans(&byte, 1, {&byte, &byte}, {8, huge}, nullptr), InvalidArgument);
}

TEST(SpanPack, MismatchedListLengthsAreRejected) {
  uint8_t byte = 0;
  EXPECT_THROW(pack_spans(&byte, 1, {&byte}, {1, 1}, nullptr), InvalidArgument);
  EXPECT_THROW(unpack_spans(&byte, 1, {&byte, &byte}, {1}, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tensorxfer::copy
