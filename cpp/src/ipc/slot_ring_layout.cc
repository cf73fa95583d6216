#include "tensorxfer/ipc/slot_ring_layout.h"

#include <cstddef>
#include <sstream>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::ipc {
namespace {

constexpr uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

template <typename Exception>
RingLayout compute_layout(uint32_t depth, uint64_t slot_nbytes, uint32_t max_producers) {
  TENSORXFER_CHECK(Exception, depth >= 1 && depth <= kMaxRingDepth, "SlotRing: depth must be in [1, ",
                   kMaxRingDepth, "], got ", depth);
  TENSORXFER_CHECK(Exception, slot_nbytes >= 1 && slot_nbytes <= kMaxSlotBytes,
                   "SlotRing: slot_nbytes must be in [1, ", kMaxSlotBytes, "], got ", slot_nbytes);
  TENSORXFER_CHECK(Exception, max_producers >= 1 && max_producers <= kMaxRingProducers,
                   "SlotRing: max_producers must be in [1, ", kMaxRingProducers, "], got ", max_producers);
  RingLayout layout;
  layout.depth = depth;
  layout.max_producers = max_producers;
  layout.slot_nbytes = slot_nbytes;
  layout.slot_stride = round_up(slot_nbytes, kSlotAlignment);
  layout.producers_offset = kRingControlOffset + sizeof(RingControl);
  layout.slot_entries_offset = layout.producers_offset + uint64_t{max_producers} * sizeof(ProducerEntry);
  layout.order_offset = layout.slot_entries_offset + uint64_t{depth} * sizeof(SlotEntry);
  // The segment payload starts page-aligned, so page-aligned offsets give page-aligned slots.
  layout.slots_offset = round_up(layout.order_offset + uint64_t{depth} * sizeof(uint64_t), kSlotAlignment);
  // depth <= 2^10 and stride <= 2^40: no overflow.
  layout.total_nbytes = layout.slots_offset + uint64_t{depth} * layout.slot_stride;
  return layout;
}

}  // namespace

bool SlotWord::decode(uint64_t word, SlotWord& out) noexcept {
  const auto state = static_cast<uint8_t>(word & 0xFF);
  if (state < static_cast<uint8_t>(SlotState::kFree) || state > static_cast<uint8_t>(SlotState::kReading)) {
    return false;
  }
  out.state = static_cast<SlotState>(state);
  out.producer = static_cast<uint32_t>((word >> 8) & 0xFF);
  out.sequence = word >> 16;
  return true;
}

bool ProducerWord::decode(uint64_t word, ProducerWord& out) noexcept {
  const auto state = static_cast<uint8_t>(word & 0xFF);
  if (state > kProducerDead) return false;
  out.state = static_cast<ProducerState>(state);
  out.generation = word >> 8;
  return out.generation <= kGenerationMask;
}

std::string SlotWord::describe() const {
  std::ostringstream text;
  switch (state) {
    case SlotState::kFree: text << "FREE"; break;
    case SlotState::kWriting: text << "WRITING(producer " << producer << ", generation " << sequence << ")"; break;
    case SlotState::kReady: text << "READY(producer " << producer << ", sequence " << sequence << ")"; break;
    case SlotState::kReading: text << "READING(sequence " << sequence << ")"; break;
  }
  return text.str();
}

RingLayout RingLayout::compute(uint32_t depth, uint64_t slot_nbytes, uint32_t max_producers, bool from_segment) {
  if (from_segment) return compute_layout<CorruptSegment>(depth, slot_nbytes, max_producers);
  return compute_layout<InvalidArgument>(depth, slot_nbytes, max_producers);
}

uint64_t ring_header_checksum(const RingHeader& header) noexcept {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  const auto* bytes = reinterpret_cast<const unsigned char*>(&header);
  for (std::size_t i = 0; i < offsetof(RingHeader, checksum); ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

RingHeader RingLayout::make_header() const noexcept {
  RingHeader header{};
  header.magic = kRingMagic;
  header.layout_version = kRingLayoutVersion;
  header.depth = depth;
  header.max_producers = max_producers;
  header.slot_nbytes = slot_nbytes;
  header.slot_stride = slot_stride;
  header.producers_offset = producers_offset;
  header.slot_entries_offset = slot_entries_offset;
  header.order_offset = order_offset;
  header.slots_offset = slots_offset;
  header.total_nbytes = total_nbytes;
  header.checksum = ring_header_checksum(header);
  return header;
}

RingLayout RingLayout::from_header(const RingHeader& header, std::size_t payload_nbytes,
                                   const std::string& context) {
  const char* what = context.c_str();
  TENSORXFER_CHECK(CorruptSegment, header.magic == kRingMagic, context, ": ring magic 0x", std::hex,
                   header.magic, ", expected 0x", kRingMagic);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.layout_version, kRingLayoutVersion);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.checksum, ring_header_checksum(header));
  const RingLayout layout = compute(header.depth, header.slot_nbytes, header.max_producers, true);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.slot_stride, layout.slot_stride);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.producers_offset, layout.producers_offset);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.slot_entries_offset, layout.slot_entries_offset);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.order_offset, layout.order_offset);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.slots_offset, layout.slots_offset);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, layout.total_nbytes);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, static_cast<uint64_t>(payload_nbytes));
  return layout;
}

}  // namespace tensorxfer::ipc
