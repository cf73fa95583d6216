// The shared-memory layout of a SlotRing (see slot_ring.h for the protocol).
//
// Payload of one ShmSegment (kind "RING"), offsets from the payload start:
//   0                    RingHeader   immutable, checksummed
//   128                  RingControl  publish counter, producer count, consumer state, wake words
//   producers_offset     ProducerEntry[max_producers]
//   slot_entries_offset  SlotEntry[depth]      per-slot state word, tick id, publish time
//   order_offset         SharedWord64[depth]   publish-order ring: (sequence << 16 | slot)
//   slots_offset         depth slots of slot_stride bytes (4096-aligned, page-lockable)
// Every type here is trivially copyable and pointer-free. Process-local code
// never re-reads the immutable fields after attach: it uses its validated copy
// (RingLayout), so a peer that scribbles on the header cannot move any offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tensorxfer/memory/shm_segment.h"
#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/peer_liveness.h"
#include "tensorxfer/sync/shared_word.h"

namespace tensorxfer::ipc {

inline constexpr uint32_t kSlotRingKind = memory::make_kind_tag("RING");
inline constexpr uint32_t kRingMagic = memory::make_kind_tag("TXRG");
// 2: producer entries are reused, liveness is a lock per entry, WRITING carries a generation.
inline constexpr uint32_t kRingLayoutVersion = 2;
inline constexpr uint32_t kMaxRingDepth = 1024;
inline constexpr uint32_t kMaxRingProducers = 255;  // the producer index is 8 bits of a slot word
inline constexpr uint32_t kDefaultRingProducers = 64;
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 40;
inline constexpr uint64_t kSlotAlignment = 4096;
inline constexpr uint64_t kRingControlOffset = 128;  // after the RingHeader, cache-line aligned

struct RingHeader {
  uint32_t magic;
  uint32_t layout_version;
  uint32_t depth;
  uint32_t max_producers;
  uint64_t slot_nbytes;
  uint64_t slot_stride;
  uint64_t producers_offset;
  uint64_t slot_entries_offset;
  uint64_t order_offset;
  uint64_t slots_offset;
  uint64_t total_nbytes;
  uint64_t checksum;  // FNV-1a over the bytes before it
};
static_assert(std::is_trivially_copyable_v<RingHeader> && sizeof(RingHeader) == 80);
static_assert(sizeof(RingHeader) <= kRingControlOffset);

enum ConsumerState : uint32_t { kConsumerOpen = 1, kConsumerClosed = 2 };

struct RingControl {
  alignas(64) sync::SharedWord64 publish_counter;  // next publish sequence to hand out
  sync::SharedWord32 producers_claimed;            // entries ever claimed: 1 + the highest index used
  sync::SharedWord32 consumer_state;               // ConsumerState
  alignas(64) sync::EventCount ready_event;        // producers notify after publish
  alignas(64) sync::EventCount free_event;         // consumer notifies after release / close
};
static_assert(std::is_trivially_copyable_v<RingControl> && sizeof(RingControl) == 192);

// Producer entries are reused: an entry belongs to whoever holds its liveness
// lock (segment participant kProducerParticipantBase + index, see
// sync/liveness_lock.h). A producer takes the lock first, then writes the
// entry; it marks the entry Detached before it lets the lock go. So an entry
// that says Attaching or Active while nobody holds its lock lost its producer
// (killed, in whatever PID namespace it ran). Every claim of an entry bumps its
// generation, and the slots a producer writes carry it (WRITING(producer,
// generation)), so a reaper that judged generation g dead never frees a slot
// of generation g + 1.
enum ProducerState : uint8_t {
  kProducerUnused = 0,     // never claimed (zeroed memory)
  kProducerAttaching = 1,  // claimed (lock held), not yet active
  kProducerActive = 2,
  kProducerDetached = 3,   // closed cleanly: holds no slot
  kProducerDead = 4,       // lost without closing: its WRITING slots of this generation get reclaimed
};
inline constexpr uint32_t kProducerParticipantBase = 1;  // segment participant 0 is the creator (the consumer)
inline constexpr uint64_t kGenerationMask = (uint64_t{1} << 48) - 1;  // fits a slot word's sequence field

// Producer entry state word: bits 0-7 ProducerState, 8-63 generation (< 2^48).
struct ProducerWord {
  ProducerState state = kProducerUnused;
  uint64_t generation = 0;

  uint64_t encode() const noexcept { return static_cast<uint64_t>(state) | (generation & kGenerationMask) << 8; }
  // False if `word` holds no known state or an impossible generation.
  [[nodiscard]] static bool decode(uint64_t word, ProducerWord& out) noexcept;
};

struct alignas(64) ProducerEntry {
  sync::SharedWord64 state;        // encoded ProducerWord; written by the lock holder (and a reaper: -> Dead)
  sync::ProcessIdentity identity;  // diagnostics only (a pid means nothing in another PID namespace)
  sync::SharedWord64 claim;        // publish sequence + 1 this producer is taking, 0 if none
};
static_assert(std::is_trivially_copyable_v<ProducerEntry> && sizeof(ProducerEntry) == 64);

struct alignas(64) SlotEntry {
  sync::SharedWord64 state;       // encoded SlotWord
  sync::SharedWord64 tick_id;     // written by the producer before READY
  sync::SharedWord64 publish_ns;  // CLOCK_MONOTONIC at publish
};
static_assert(std::is_trivially_copyable_v<SlotEntry> && sizeof(SlotEntry) == 64);

// Slot state word: bits 0-7 state, 8-15 producer index, 16-63 publish sequence
// (for WRITING: the producer entry's generation).
//   FREE                         -> WRITING(producer, gen)  acquire_free
//   WRITING(producer, gen)       -> READY(producer, seq)    publish
//   WRITING(producer, gen)       -> FREE                    abandon, close
//   READY(producer, seq)         -> READING(seq)            acquire_ready
//   READING(seq)                 -> FREE                    release
//   WRITING(lost producer, gen)  -> FREE                    reclaim
enum class SlotState : uint8_t { kFree = 1, kWriting = 2, kReady = 3, kReading = 4 };
inline constexpr uint64_t kSequenceMask = (uint64_t{1} << 48) - 1;

struct SlotWord {
  SlotState state = SlotState::kFree;
  uint32_t producer = 0;
  uint64_t sequence = 0;

  uint64_t encode() const noexcept {
    return static_cast<uint64_t>(state) | static_cast<uint64_t>(producer & 0xFF) << 8 |
           (sequence & kSequenceMask) << 16;
  }
  // False if `word` holds no known state.
  [[nodiscard]] static bool decode(uint64_t word, SlotWord& out) noexcept;
  std::string describe() const;
};

// Order-ring cell: which slot carries publish sequence `sequence`.
inline uint64_t encode_order_cell(uint64_t sequence, uint32_t slot) noexcept {
  return (sequence & kSequenceMask) << 16 | (slot & 0xFFFF);
}

// Process-local copy of the layout, computed from the three parameters.
struct RingLayout {
  uint32_t depth = 0;
  uint32_t max_producers = 0;
  uint64_t slot_nbytes = 0;
  uint64_t slot_stride = 0;
  uint64_t producers_offset = 0;
  uint64_t slot_entries_offset = 0;
  uint64_t order_offset = 0;
  uint64_t slots_offset = 0;
  uint64_t total_nbytes = 0;

  // Throws `Exception`-typed errors (InvalidArgument for user input, CorruptSegment
  // for values read from a segment) naming the bad parameter.
  static RingLayout compute(uint32_t depth, uint64_t slot_nbytes, uint32_t max_producers, bool from_segment);
  RingHeader make_header() const noexcept;
  // Validates a header read from a segment whose payload is `payload_nbytes`
  // bytes and returns its layout. Throws CorruptSegment naming the field.
  static RingLayout from_header(const RingHeader& header, std::size_t payload_nbytes, const std::string& context);
};

uint64_t ring_header_checksum(const RingHeader& header) noexcept;

}  // namespace tensorxfer::ipc
