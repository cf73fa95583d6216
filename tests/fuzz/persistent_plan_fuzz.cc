// The persistent plan's builders: strided_pieces (a task's strided view into
// contiguous runs) and append_stream_copy (a schedule segment's byte range
// into copy spans), fed with views a tensor library can hand over (any shape
// over memory that exists, size-1 dimensions with any stride, broadcast
// strides of 0, negative strides) and offsets and sizes from a schedule.
//
// Contract (persistent_plan.h): strided_pieces returns runs that cover the
// view's elements in row-major order, each inside the view's memory, or
// throws InvalidArgument; append_stream_copy appends spans that copy exactly
// [src_offset, src_offset + nbytes) of one byte stream onto the other, or
// throws InvalidArgument when a range runs past its pieces. The target copies
// the spans over real memory (ASan checks every byte) and compares the result
// with an element-by-element copy.
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "fuzz_support.h"
#include "tensorxfer/resharding/persistent_plan.h"

namespace {

using tensorxfer::InvalidArgument;
using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::resharding;

constexpr int64_t kMaxExtent = 1 << 16;   // bytes of memory behind one view
constexpr uint64_t kMaxStream = 1 << 16;  // bytes of one view's stream

struct View {
  uint64_t itemsize = 1;
  std::vector<int64_t> shape, strides;
  std::unique_ptr<std::byte[]> memory;
  std::byte* base = nullptr;  // element 0 (memory + the most negative offset)
  int64_t extent = 0;
  uint64_t count = 1;
  bool fits = false;          // the view lies in `memory` and its stream is small enough to check
};

// A view a tensor could be: sizes small (or 1, whose stride is anything), strides in bytes.
View take_view(FuzzInput& input) {
  View view;
  view.itemsize = input.take_in<uint64_t>(1, 16);
  const int ndim = input.take_in<int>(0, 4);
  int64_t low = 0, high = 0;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    const uint8_t tag = input.take<uint8_t>();
    const int64_t size = (tag & 0x80) != 0 ? 1 : (tag & 7);
    int64_t stride;
    if (size == 1 && (tag & 0x40) != 0) {
      stride = input.take<int64_t>();  // a size-1 dimension's stride never moves: torch allows any
    } else {
      stride = static_cast<int64_t>(input.take<int8_t>()) * static_cast<int64_t>((tag & 0x08) != 0 ? view.itemsize : 1);
    }
    view.shape.push_back(size);
    view.strides.push_back(stride);
    view.count *= static_cast<uint64_t>(size);
    if (size > 1) {
      int64_t span = 0;
      overflow |= __builtin_mul_overflow(stride, size - 1, &span);
      overflow |= span < 0 ? __builtin_add_overflow(low, span, &low) : __builtin_add_overflow(high, span, &high);
    }
  }
  view.extent = high - low + static_cast<int64_t>(view.itemsize);
  view.fits = !overflow && view.extent <= kMaxExtent && view.count * view.itemsize <= kMaxStream;
  if (view.fits) {
    view.memory.reset(new std::byte[static_cast<std::size_t>(view.extent)]);
    for (int64_t i = 0; i < view.extent; ++i) view.memory[static_cast<std::size_t>(i)] = static_cast<std::byte>(i * 7 + 3);
    view.base = view.memory.get() - low;
  }
  return view;
}

// The view's byte stream, element by element in row-major order.
std::vector<std::byte*> naive_stream(const View& view) {
  std::vector<std::byte*> stream;
  if (view.count == 0) return stream;
  std::vector<int64_t> index(view.shape.size(), 0);
  for (uint64_t e = 0; e < view.count; ++e) {
    int64_t offset = 0;
    for (std::size_t d = 0; d < view.shape.size(); ++d) {
      if (view.shape[d] > 1) offset += index[d] * view.strides[d];
    }
    for (uint64_t b = 0; b < view.itemsize; ++b) stream.push_back(view.base + offset + static_cast<int64_t>(b));
    for (std::size_t d = view.shape.size(); d-- > 0;) {
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
  return stream;
}

bool pieces_of(View& view, Pieces& pieces) {
  return tensorxfer::fuzz::accepted<InvalidArgument>("strided_pieces", [&] {
    pieces = strided_pieces(view.base, view.itemsize, view.shape, view.strides);
  });
}

void check_pieces(const View& view, const Pieces& pieces, const std::vector<std::byte*>& stream) {
  std::size_t position = 0;
  for (const Piece& piece : pieces) {
    TENSORXFER_FUZZ_EXPECT(piece.nbytes >= 1, "an empty piece");
    for (uint64_t b = 0; b < piece.nbytes; ++b, ++position) {
      TENSORXFER_FUZZ_EXPECT(position < stream.size(), "pieces hold more bytes than the view's ", stream.size());
      TENSORXFER_FUZZ_EXPECT(piece.data + b == stream[position], "byte ", position,
                             " of the pieces is not the view's byte in row-major order");
    }
  }
  TENSORXFER_FUZZ_EXPECT(position == stream.size(), "pieces hold ", position, " bytes, the view ", stream.size());
  (void)view;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  View source = take_view(input);
  View destination = take_view(input);
  if (!source.fits || !destination.fits) return 0;
  Pieces source_pieces, destination_pieces;
  if (!pieces_of(source, source_pieces) || !pieces_of(destination, destination_pieces)) return 0;
  const std::vector<std::byte*> source_stream = naive_stream(source);
  const std::vector<std::byte*> destination_stream = naive_stream(destination);
  check_pieces(source, source_pieces, source_stream);
  check_pieces(destination, destination_pieces, destination_stream);

  // A segment of the schedule: offsets and size as a (possibly lying) schedule gives them.
  const uint8_t tag = input.take<uint8_t>();
  const uint64_t src_offset = (tag & 1) != 0 ? input.take<uint64_t>() : input.take<uint16_t>();
  const uint64_t dst_offset = (tag & 2) != 0 ? input.take<uint64_t>() : input.take<uint16_t>();
  const uint64_t nbytes = (tag & 4) != 0 ? input.take<uint64_t>() : input.take<uint16_t>();
  std::vector<tensorxfer::copy::Span> spans;
  if (!tensorxfer::fuzz::accepted<InvalidArgument>("append_stream_copy", [&] {
        append_stream_copy(spans, source_pieces, src_offset, destination_pieces, dst_offset, nbytes);
      })) {
    TENSORXFER_FUZZ_EXPECT(src_offset > source_stream.size() || nbytes > source_stream.size() - src_offset ||
                               dst_offset > destination_stream.size() || nbytes > destination_stream.size() - dst_offset,
                           "append_stream_copy refused a range that fits both streams");
    return 0;
  }
  if (nbytes == 0) {
    TENSORXFER_FUZZ_EXPECT(spans.empty(), "an empty copy appended spans");
    return 0;
  }
  TENSORXFER_FUZZ_EXPECT((src_offset + nbytes <= source_stream.size() &&
                                         dst_offset + nbytes <= destination_stream.size()),
                         "append_stream_copy accepted a range past a stream");
  uint64_t total = 0;
  for (const auto& span : spans) {
    std::memmove(span.dst, span.src, span.nbytes);  // ASan checks every byte of both sides
    total += span.nbytes;
  }
  TENSORXFER_FUZZ_EXPECT(total == nbytes, "spans copy ", total, " bytes of ", nbytes);
  // Where no destination byte is written twice (no broadcast stride), each holds its source byte.
  const std::set<std::byte*> distinct(destination_stream.begin() + static_cast<std::ptrdiff_t>(dst_offset),
                                      destination_stream.begin() + static_cast<std::ptrdiff_t>(dst_offset + nbytes));
  if (distinct.size() == nbytes) {
    for (uint64_t i = 0; i < nbytes; ++i) {
      TENSORXFER_FUZZ_EXPECT(*destination_stream[dst_offset + i] == *source_stream[src_offset + i],
                             "stream byte ", i, " copied wrong");
    }
  }
  return 0;
}
