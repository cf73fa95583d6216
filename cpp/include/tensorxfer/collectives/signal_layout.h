// The shared-memory layout of one rank's IpcMemory segment: a validated
// header, the rank's wake-up word, its barrier words, then its data region.
// This file is the whole barrier protocol's data; collectives/barrier.h runs it.
//
// Every rank r owns one segment laid out as (offsets from the payload start):
//
//   0                      SignalHeader   immutable after create, checksummed
//   64                     WakeLine       EventCount rank r sleeps on
//   128                    barrier_in     world_size FlagLines, one per writer rank
//   128 + 64 * world_size  barrier_out    world_size FlagLines, one per writer rank
//   data_offset            data           data_nbytes bytes (page-aligned)
//
// Who writes and who reads (vLLM's Signal: start flags, end flags, an epoch):
//   barrier_in[j] of rank r   written by rank j only (release store of its
//                             current epoch when it arrives at a start
//                             barrier); read by rank r only (acquire loads
//                             until every line holds >= its own epoch).
//   barrier_out[j] of rank r  the same for middle and end barriers.
//   wake of rank r            bumped by any rank j after it wrote one of rank
//                             r's flags (EventCount::notify_all); rank r
//                             sleeps on it when a spin found a flag missing.
//   barrier_in[j].descriptor[s % 2] of rank r
//                             written by rank j just before its flag store for
//                             the start barrier of its operation number s (plain
//                             stores, published by that release); read by rank r
//                             after that barrier, to refuse calls that differ
//                             between ranks. Rank j rewrites slot s % 2 only at
//                             operation s + 2, which it cannot start before rank
//                             r arrived at operation s + 1's start barrier, i.e.
//                             after r finished reading it: no concurrent access.
//   data of rank r            written by rank r (its input) or by the
//                             algorithm's owner of a slice; read by every rank
//                             between the barriers that bracket it
//                             (collectives/communicator.cc says which).
//
// Epochs (barrier_flag) are 64-bit, start at 1 and only increase; every
// barrier uses a new one, so a stale flag never matches a later barrier and
// `flag >= epoch` is the arrival test (a fast rank may already be one barrier
// ahead on the other array, never on the same one).
//
// Flags are on their own 64-byte lines: a writer's store invalidates nobody
// else's flag, and the reader's spin polls lines only written once per epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::collectives {

inline constexpr std::size_t kCacheLine = 64;
inline constexpr uint64_t kSignalMagic = 0x4C414E4749534358ull;  // "XCSIGNAL" little-endian
inline constexpr uint32_t kSignalLayoutVersion = 1;
// More ranks than this on one host is not a local group any more; it also
// bounds the layout so sizes cannot overflow.
inline constexpr int kMaxWorldSize = 1024;
inline constexpr std::size_t kDataAlignment = 4096;

// What a rank is about to do; compared across ranks after the start barrier.
struct OpDescriptor {
  uint32_t kind;    // the operation (communicator.cc encodes collective, op, algorithm)
  uint32_t dtype;   // DLPack code << 16 | bits << 8 | lanes
  uint64_t nbytes;  // bytes of the caller's tensor (the input for all-gather)
  uint64_t aux;     // root rank, or zero-copy offset + 1 (0: not zero-copy)
  bool operator==(const OpDescriptor& other) const noexcept {
    return kind == other.kind && dtype == other.dtype && nbytes == other.nbytes && aux == other.aux;
  }
};
static_assert(std::is_trivially_copyable_v<OpDescriptor> && sizeof(OpDescriptor) == 24);

struct SignalHeader {
  // Immutable after create, covered by checksum.
  uint64_t magic;
  uint32_t layout_version;
  int32_t world_size;
  int32_t rank;  // the rank that owns this segment
  uint32_t reserved;
  uint64_t data_offset;
  uint64_t data_nbytes;
  uint64_t checksum;  // FNV-1a over the bytes before it
  uint64_t padding[2];  // zero
};
static_assert(std::is_trivially_copyable_v<SignalHeader> && sizeof(SignalHeader) == 64);

struct alignas(kCacheLine) WakeLine {
  sync::EventCount wake;  // see the table above
  uint8_t padding[kCacheLine - sizeof(sync::EventCount)];
};
static_assert(std::is_trivially_copyable_v<WakeLine> && sizeof(WakeLine) == kCacheLine);

struct alignas(kCacheLine) FlagLine {
  sync::SharedWord64 epoch;    // the last epoch the writer rank arrived at; 0: never
  OpDescriptor descriptor[2];  // barrier_in only: the writer's operation, by operation number % 2
  uint8_t padding[kCacheLine - sizeof(sync::SharedWord64) - 2 * sizeof(OpDescriptor)];
};
static_assert(std::is_trivially_copyable_v<FlagLine> && sizeof(FlagLine) == kCacheLine);
static_assert(alignof(FlagLine) == kCacheLine);

// Offsets of one rank's layout, computed with overflow checks.
struct SignalLayout {
  int world_size = 0;
  std::size_t wake_offset = 0;
  std::size_t barrier_in_offset = 0;
  std::size_t barrier_out_offset = 0;
  std::size_t data_offset = 0;
  std::size_t data_nbytes = 0;
  std::size_t total_nbytes = 0;  // payload bytes of the segment

  // Throws InvalidArgument unless 1 <= world_size <= kMaxWorldSize and the
  // total fits in size_t.
  static SignalLayout compute(int world_size, std::size_t data_nbytes);
};

// The header create() stores and attach() checks.
SignalHeader make_signal_header(const SignalLayout& layout, int rank);
uint64_t signal_header_checksum(const SignalHeader& header) noexcept;
// Validates a header read from a segment whose payload is `payload_nbytes`
// bytes and that should belong to `expected_rank` of a `expected_world_size`
// group. Throws CorruptSegment naming `context`, the field, expected and got.
void validate_signal_header(const SignalHeader& header, std::size_t payload_nbytes, int expected_rank,
                            int expected_world_size, const std::string& context);

}  // namespace tensorxfer::collectives
