// A persistent plan's byte stream between two ranks on different hosts, cut into
// messages for a network engine (gloo, MPI) once, at build time.
//
// For each ordered pair of ranks (or chain of receivers, see the Python
// resharding/copy_services/_network_plan.py), every task's pieces in task order
// form one byte stream. The stream is cut into messages by sizes alone
// (message_sizes), so sender and receivers cut it alike without telling each
// other anything. Each side then decides alone, message by message, how its
// bytes get in or out:
//   direct  the message lies in one contiguous run of the side's memory: it is
//           sent from, or received into, the user's memory (no copy);
//   staged  it is packed from the user's pieces into a staging buffer before the
//           send, or unpacked from one after the receive: `copies`.
// Staging buffers are allocated once; message k uses buffer k % buffers.size().
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensorxfer/copy/span_pack.h"
#include "tensorxfer/resharding/persistent_plan.h"

namespace tensorxfer::resharding {

// The sizes of the messages of a stream of items (tasks) of `item_nbytes`
// bytes, in order: small items share messages of at most `bucket_nbytes`
// bytes (an item may straddle two); an item of at least `bucket_nbytes / 2`
// starts a message of its own and is cut into messages of at most
// `bucket_nbytes` (so a large contiguous tensor goes from and into its own
// memory). Throws InvalidArgument for bucket_nbytes == 0 or a total that
// overflows. Empty items add nothing; no message is empty.
std::vector<uint64_t> message_sizes(const std::vector<uint64_t>& item_nbytes, uint64_t bucket_nbytes);

// One message, from one side's point of view.
struct StreamMessage {
  uint64_t offset = 0;  // in the stream
  uint64_t nbytes = 0;
  // Where the whole message lies in the user's memory, or nullptr: staged.
  std::byte* direct = nullptr;
  // Staged only: user pieces -> staging (packing), or staging -> user pieces.
  std::vector<copy::Span> copies;
};

enum class StreamSide { kSend, kReceive };

// The concatenation of `items` (each a task's pieces), adjacent pieces merged:
// the stream's memory on one side.
Pieces concatenate_pieces(const std::vector<const Pieces*>& items);

// The messages of `stream` cut at `sizes` (which must add up to the stream's
// bytes: InvalidArgument otherwise), each direct where it lies in one piece,
// else copied to (kSend) or from (kReceive) staging[k % staging.size()], each
// buffer at least as large as the largest staged message (`staging_nbytes`,
// checked). `staging` may be empty only when no message is staged
// (InvalidArgument otherwise: call with the buffers, or ask staged_count first).
std::vector<StreamMessage> cut_stream(const Pieces& stream, const std::vector<uint64_t>& sizes, StreamSide side,
                                      const std::vector<std::byte*>& staging, uint64_t staging_nbytes);

// How many of the messages cut at `sizes` would be staged (lie across pieces).
std::size_t staged_count(const Pieces& stream, const std::vector<uint64_t>& sizes);

}  // namespace tensorxfer::resharding
