// Span copies: many (destination, source, byte count) copies in one call, and
// the two uses the copy services make of them: packing a list of byte spans
// back to back into one buffer (one message instead of thousands) and
// unpacking such a buffer into its spans on arrival.
//
//   packed layout: span i starts at offset(i) = nbytes(0) + ... + nbytes(i-1)
//   (no padding: the receiver computes the same offsets from the same sizes).
//
// Spans are raw host addresses: the caller keeps the memory behind every span
// alive and unchanged by others for the duration of the call.
#pragma once

#include <cstddef>
#include <vector>

namespace tensorxfer::copy {

class CopyEngine;

// One copy: nbytes from src to dst.
struct Span {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::size_t nbytes = 0;
};

// How copy_spans writes its destinations.
enum class SpanStores {
  // Streaming (non-temporal) stores when the spans total kStreamingSpanBytes or
  // more, cached stores below that.
  kBySize,
  // Streaming stores whatever the total: the caller knows these spans are a
  // piece of a transfer far larger than the caches (a large run's receives,
  // unpacked one slot at a time), which nobody reads back soon.
  kStreaming,
};

// The total from which copy_spans streams under SpanStores::kBySize.
inline constexpr std::size_t kStreamingSpanBytes = std::size_t{8} << 20;

// Sum of `nbytes`; throws InvalidArgument if it overflows std::size_t.
std::size_t packed_nbytes(const std::vector<std::size_t>& nbytes);

// Performs spans[0, count). Checked before any byte moves (InvalidArgument
// naming the span index): a null dst or src with nbytes > 0, an address range
// that wraps around, a span whose dst and src overlap, a total that overflows.
// Spans' destinations must not overlap each other (not checked; which write
// wins is then unspecified). Work is split across `engine`'s threads and the
// caller when the total is large enough (caller only when `engine` is null).
// `stores` picks cached or streaming stores (see SpanStores).
// Returns when all are done. Thread-safe as far as the engine is.
void copy_spans(const Span* spans, std::size_t count, CopyEngine* engine,
                SpanStores stores = SpanStores::kBySize);
inline void copy_spans(const std::vector<Span>& spans, CopyEngine* engine,
                       SpanStores stores = SpanStores::kBySize) {
  copy_spans(spans.data(), spans.size(), engine, stores);
}

// dst[offset(i) ...] = sources[i] for every span. dst must hold at least
// packed_nbytes(sizes) bytes (InvalidArgument naming both otherwise) and must
// not overlap any source (InvalidArgument naming the span).
void pack_spans(void* dst, std::size_t dst_capacity, const std::vector<const void*>& sources,
                const std::vector<std::size_t>& nbytes, CopyEngine* engine);

// destinations[i] = src[offset(i) ...] for every span; the inverse of
// pack_spans. src must hold at least packed_nbytes(sizes) bytes and must not
// overlap any destination. Throws InvalidArgument like pack_spans.
void unpack_spans(const void* src, std::size_t src_nbytes, const std::vector<void*>& destinations,
                  const std::vector<std::size_t>& nbytes, CopyEngine* engine);

}  // namespace tensorxfer::copy
