#include "tensorxfer/resharding/stream_messages.h"

#include <algorithm>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::resharding {
namespace {

// Walks a stream's pieces in order, answering for each message whether it lies
// in one piece (messages are visited in stream order, so one pass suffices).
class PieceCursor {
 public:
  explicit PieceCursor(const Pieces& pieces) : pieces_(pieces) {}

  // The address of [offset, offset + nbytes) if one piece holds all of it, else nullptr.
  // `offset` never goes back between calls.
  std::byte* contiguous_at(uint64_t offset, uint64_t nbytes) {
    while (index_ < pieces_.size() && start_ + pieces_[index_].nbytes <= offset) {
      start_ += pieces_[index_].nbytes;
      ++index_;
    }
    if (index_ == pieces_.size()) return nullptr;
    const Piece& piece = pieces_[index_];
    const uint64_t within = offset - start_;
    return piece.nbytes - within >= nbytes ? piece.data + within : nullptr;
  }

 private:
  const Pieces& pieces_;
  std::size_t index_ = 0;
  uint64_t start_ = 0;  // stream offset of pieces_[index_]
};

void check_sizes_cover(const Pieces& stream, const std::vector<uint64_t>& sizes) {
  uint64_t total = 0;
  for (const uint64_t size : sizes) {
    TENSORXFER_CHECK(InvalidArgument, size > 0, "a stream's messages must not be empty");
    total = checked_add(total, size, "a stream's message sizes");
  }
  TENSORXFER_CHECK_EQ(InvalidArgument, "a stream's message sizes against its bytes", total, pieces_nbytes(stream));
}

}  // namespace

std::vector<uint64_t> message_sizes(const std::vector<uint64_t>& item_nbytes, uint64_t bucket_nbytes) {
  TENSORXFER_CHECK(InvalidArgument, bucket_nbytes > 0, "bucket_nbytes must be > 0");
  uint64_t total = 0;
  for (const uint64_t nbytes : item_nbytes) total = checked_add(total, nbytes, "a stream's bytes");
  std::vector<uint64_t> sizes;
  sizes.reserve(static_cast<std::size_t>(std::min<uint64_t>(total / bucket_nbytes + item_nbytes.size(), 1 << 20)));
  uint64_t open = 0;  // bytes of the message being filled with small items
  auto close_open = [&] {
    if (open > 0) sizes.push_back(open);
    open = 0;
  };
  for (uint64_t nbytes : item_nbytes) {
    if (nbytes == 0) continue;
    if (nbytes >= (bucket_nbytes + 1) / 2) {
      close_open();
      for (; nbytes > bucket_nbytes; nbytes -= bucket_nbytes) sizes.push_back(bucket_nbytes);
      sizes.push_back(nbytes);
      continue;
    }
    while (nbytes > 0) {
      const uint64_t step = std::min(nbytes, bucket_nbytes - open);
      open += step;
      nbytes -= step;
      if (open == bucket_nbytes) close_open();
    }
  }
  close_open();
  return sizes;
}

Pieces concatenate_pieces(const std::vector<const Pieces*>& items) {
  Pieces stream;
  for (const Pieces* item : items) {
    for (const Piece& piece : *item) {
      if (piece.nbytes == 0) continue;
      if (!stream.empty() && stream.back().data + stream.back().nbytes == piece.data) {
        stream.back().nbytes = checked_add(stream.back().nbytes, piece.nbytes, "a stream's bytes");
      } else {
        stream.push_back(piece);
      }
    }
  }
  return stream;
}

std::size_t staged_count(const Pieces& stream, const std::vector<uint64_t>& sizes) {
  check_sizes_cover(stream, sizes);
  PieceCursor cursor(stream);
  std::size_t staged = 0;
  uint64_t offset = 0;
  for (const uint64_t size : sizes) {
    staged += cursor.contiguous_at(offset, size) == nullptr;
    offset += size;
  }
  return staged;
}

std::vector<StreamMessage> cut_stream(const Pieces& stream, const std::vector<uint64_t>& sizes, StreamSide side,
                                      const std::vector<std::byte*>& staging, uint64_t staging_nbytes) {
  check_sizes_cover(stream, sizes);
  for (const std::byte* buffer : staging) {
    TENSORXFER_CHECK(InvalidArgument, buffer != nullptr, "a stream's staging buffer is null");
  }
  PieceCursor cursor(stream);
  std::vector<StreamMessage> messages(sizes.size());
  uint64_t offset = 0;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    StreamMessage& message = messages[k];
    message.offset = offset;
    message.nbytes = sizes[k];
    message.direct = cursor.contiguous_at(offset, sizes[k]);
    if (message.direct == nullptr) {
      TENSORXFER_CHECK(InvalidArgument, !staging.empty(), "message ", k, " of a stream lies across pieces and ",
                       "needs a staging buffer, got none");
      TENSORXFER_CHECK(InvalidArgument, sizes[k] <= staging_nbytes, "message ", k, " has ", sizes[k],
                       " bytes, more than the staging buffers' ", staging_nbytes);
      const Pieces buffer{Piece{staging[k % staging.size()], sizes[k]}};
      if (side == StreamSide::kSend) {
        append_stream_copy(message.copies, stream, offset, buffer, 0, sizes[k]);
      } else {
        append_stream_copy(message.copies, buffer, 0, stream, offset, sizes[k]);
      }
    }
    offset += sizes[k];
  }
  return messages;
}

}  // namespace tensorxfer::resharding
