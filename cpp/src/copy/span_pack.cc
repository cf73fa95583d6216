#include "tensorxfer/copy/span_pack.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "copy_kernels.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::copy {
namespace {

// Work is handed to threads in pieces of about this many bytes: a piece is a
// run of whole small spans or one slice of a large span. Big enough that
// taking a piece costs nothing next to copying it, small enough that a thread
// descheduled mid-piece leaves the rest to the others (2 cores, busy machine).
constexpr std::size_t kPieceBytes = std::size_t{256} << 10;
// Totals below this are copied on the calling thread: waking workers costs
// more than it saves (same break-even as CopyEngine::copy's threshold).
constexpr std::size_t kParallelBytes = std::size_t{512} << 10;

bool ranges_overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

bool wraps_around(const void* address, std::size_t nbytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(address);
  return nbytes > std::numeric_limits<std::uintptr_t>::max() - begin;
}

void check_span(const Span& span, std::size_t index) {
  if (span.nbytes == 0) return;
  TENSORXFER_CHECK(InvalidArgument, span.dst != nullptr && span.src != nullptr, "span ", index,
                   ": null address for ", span.nbytes, " bytes (dst=", span.dst, ", src=", span.src,
                   ")");
  TENSORXFER_CHECK(InvalidArgument, !wraps_around(span.dst, span.nbytes) && !wraps_around(span.src, span.nbytes),
                   "span ", index, ": ", span.nbytes, " bytes from dst=", span.dst, " or src=", span.src,
                   " wrap around the address space");
  TENSORXFER_CHECK(InvalidArgument, !ranges_overlap(span.dst, span.nbytes, span.src, span.nbytes), "span ",
                   index, ": dst ", span.dst, " and src ", span.src, " overlap (", span.nbytes, " bytes)");
}

// One thread's unit of work: a slice [offset, offset + nbytes) of one span.
struct Slice {
  std::size_t span;
  std::size_t offset;
  std::size_t nbytes;
};

// Slices in span order, each large span cut in kPieceBytes slices; `pieces`
// gets the index of the first slice of each piece (about kPieceBytes each),
// plus the end.
void plan_pieces(const Span* spans, std::size_t count, std::vector<Slice>& slices,
                 std::vector<std::size_t>& pieces) {
  std::size_t piece_bytes = 0;
  pieces.push_back(0);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t offset = 0; offset < spans[i].nbytes; offset += kPieceBytes) {
      const std::size_t nbytes = std::min(kPieceBytes, spans[i].nbytes - offset);
      if (piece_bytes > 0 && piece_bytes + nbytes > kPieceBytes) {
        pieces.push_back(slices.size());
        piece_bytes = 0;
      }
      slices.push_back({i, offset, nbytes});
      piece_bytes += nbytes;
    }
  }
  if (pieces.back() != slices.size()) pieces.push_back(slices.size());
}

void copy_one(const Span& span, std::size_t offset, std::size_t nbytes, bool streaming) {
  std::byte* dst = span.dst + offset;
  const std::byte* src = span.src + offset;
  if (streaming) {
    detail::streaming_copy(dst, src, nbytes);
  } else {
    detail::small_copy(dst, src, nbytes);
  }
}

}  // namespace

std::size_t packed_nbytes(const std::vector<std::size_t>& nbytes) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < nbytes.size(); ++i) {
    TENSORXFER_CHECK(InvalidArgument, nbytes[i] <= std::numeric_limits<std::size_t>::max() - total,
                     "span sizes overflow: span ", i, " adds ", nbytes[i], " bytes to ", total);
    total += nbytes[i];
  }
  return total;
}

void copy_spans(const Span* spans, std::size_t count, CopyEngine* engine, SpanStores stores) {
  TENSORXFER_CHECK(InvalidArgument, count == 0 || spans != nullptr, "copy_spans: null span list for ", count,
                   " spans");
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    check_span(spans[i], i);
    TENSORXFER_CHECK(InvalidArgument, spans[i].nbytes <= std::numeric_limits<std::size_t>::max() - total,
                     "span sizes overflow: span ", i, " adds ", spans[i].nbytes, " bytes to ", total);
    total += spans[i].nbytes;
  }
  // By size: from kStreamingSpanBytes on, the data is about to be sent or was
  // just received, not read back by this thread.
  const bool streaming = stores == SpanStores::kStreaming || total >= kStreamingSpanBytes;
  if (engine == nullptr || total < kParallelBytes || engine->max_parallelism() < 2) {
    for (std::size_t i = 0; i < count; ++i) {
      if (spans[i].nbytes > 0) copy_one(spans[i], 0, spans[i].nbytes, streaming);
    }
    if (streaming) detail::streaming_fence();
    return;
  }
  std::vector<Slice> slices;
  std::vector<std::size_t> pieces;
  plan_pieces(spans, count, slices, pieces);
  engine->parallel_for(pieces.size() - 1, 1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t piece = begin; piece < end; ++piece) {
      for (std::size_t s = pieces[piece]; s < pieces[piece + 1]; ++s) {
        copy_one(spans[slices[s].span], slices[s].offset, slices[s].nbytes, streaming);
      }
    }
    // Each thread orders its own streaming stores before the job's completion
    // is published to the caller.
    if (streaming) detail::streaming_fence();
  });
}

void pack_spans(void* dst, std::size_t dst_capacity, const std::vector<const void*>& sources,
                const std::vector<std::size_t>& nbytes, CopyEngine* engine) {
  TENSORXFER_CHECK_EQ(InvalidArgument, "pack_spans", sources.size(), nbytes.size());
  const std::size_t total = packed_nbytes(nbytes);
  TENSORXFER_CHECK(InvalidArgument, total <= dst_capacity, "pack_spans: dst holds ", dst_capacity,
                   " bytes, the ", nbytes.size(), " spans need ", total);
  TENSORXFER_CHECK(InvalidArgument, total == 0 || dst != nullptr, "pack_spans: dst is null");
  std::vector<Span> spans(sources.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    spans[i] = {static_cast<const std::byte*>(sources[i]), static_cast<std::byte*>(dst) + offset, nbytes[i]};
    TENSORXFER_CHECK(InvalidArgument, !ranges_overlap(dst, total, sources[i], nbytes[i]),
                     "pack_spans: source span ", i, " overlaps dst");
    offset += nbytes[i];
  }
  copy_spans(spans.data(), spans.size(), engine);
}

void unpack_spans(const void* src, std::size_t src_nbytes, const std::vector<void*>& destinations,
                  const std::vector<std::size_t>& nbytes, CopyEngine* engine) {
  TENSORXFER_CHECK_EQ(InvalidArgument, "unpack_spans", destinations.size(), nbytes.size());
  const std::size_t total = packed_nbytes(nbytes);
  TENSORXFER_CHECK(InvalidArgument, total <= src_nbytes, "unpack_spans: src holds ", src_nbytes,
                   " bytes, the ", nbytes.size(), " spans need ", total);
  TENSORXFER_CHECK(InvalidArgument, total == 0 || src != nullptr, "unpack_spans: src is null");
  std::vector<Span> spans(destinations.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < destinations.size(); ++i) {
    spans[i] = {static_cast<const std::byte*>(src) + offset, static_cast<std::byte*>(destinations[i]), nbytes[i]};
    TENSORXFER_CHECK(InvalidArgument, !ranges_overlap(src, total, destinations[i], nbytes[i]),
                     "unpack_spans: destination span ", i, " overlaps src");
    offset += nbytes[i];
  }
  copy_spans(spans.data(), spans.size(), engine);
}

}  // namespace tensorxfer::copy
