// The slot ring's shared layout and slot table, as peers write them.
//
// Each input makes a real ring (this process its consumer) and then, through
// a mapping of its own (as another process would), writes over one of:
//   header mode  the RingHeader (fields kept or replaced, checksum recomputed
//                on request): SlotRing::attach, the producers' decoder, reads it;
//   table mode   the control words, producer entries, slot entries and the
//                publish-order ring: the consumer's and a producer's calls
//                read them (acquire_ready with its peer watch, release,
//                acquire_free, publish, abandon, close).
//
// Contract (slot_ring.h): "slot indices and state words read from shared
// memory are checked before use, so a corrupt segment yields CorruptSegment,
// never an out-of-bounds access". Every call returns or throws a
// tensorxfer::Error; a slot it hands out is in range and its bytes are mapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "fuzz_support.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace {

using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::ipc;
namespace memory = tensorxfer::memory;
namespace sync = tensorxfer::sync;

// The ring's segment mapped again, as a peer maps it; unmapped at scope end.
class PeerMapping {
 public:
  PeerMapping(const std::string& name, std::size_t payload_nbytes)
      : nbytes_(memory::kSegmentHeaderBytes + payload_nbytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return;
    void* base = ::mmap(nullptr, nbytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base != MAP_FAILED) base_ = static_cast<std::byte*>(base);
  }
  ~PeerMapping() {
    if (base_ != nullptr) ::munmap(base_, nbytes_);
  }
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  std::byte* payload() const { return base_ == nullptr ? nullptr : base_ + memory::kSegmentHeaderBytes; }

 private:
  std::size_t nbytes_;
  std::byte* base_ = nullptr;
};

template <typename T>
void maybe_replace(FuzzInput& input, uint32_t keep_mask, int bit, T& field) {
  if ((keep_mask >> bit & 1) == 0) input.take_into(&field, sizeof(field));
}

// A 64-bit word as a peer might leave it: a well-formed slot or producer word, or anything.
uint64_t take_word(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  switch (tag >> 6) {
    case 0: return SlotWord{static_cast<SlotState>(1 + (tag & 3)), static_cast<uint32_t>(tag >> 2 & 3),
                            input.take<uint8_t>()}.encode();
    case 1: return ProducerWord{static_cast<ProducerState>(tag % 5), input.take<uint8_t>()}.encode();
    case 2: return input.take<uint8_t>();
    default: return input.take<uint64_t>();
  }
}

void touch_slot(SlotRing& ring, uint32_t slot) {
  TENSORXFER_FUZZ_EXPECT(slot < ring.depth(), "a call handed out slot ", slot, " of a ring of depth ", ring.depth());
  volatile std::byte* bytes = ring.slot_data(slot);
  bytes[0] = bytes[0];
  bytes[ring.slot_nbytes() - 1] = std::byte{0x5A};
}

void header_mode(FuzzInput& input, SlotRing& consumer, const RingLayout& layout, std::byte* peer_payload) {
  const uint32_t keep = input.take<uint32_t>();
  RingHeader header;
  std::memcpy(&header, peer_payload, sizeof(header));
  maybe_replace(input, keep, 0, header.magic);
  maybe_replace(input, keep, 1, header.layout_version);
  maybe_replace(input, keep, 2, header.depth);
  maybe_replace(input, keep, 3, header.max_producers);
  maybe_replace(input, keep, 4, header.slot_nbytes);
  maybe_replace(input, keep, 5, header.slot_stride);
  maybe_replace(input, keep, 6, header.producers_offset);
  maybe_replace(input, keep, 7, header.slot_entries_offset);
  maybe_replace(input, keep, 8, header.order_offset);
  maybe_replace(input, keep, 9, header.slots_offset);
  maybe_replace(input, keep, 10, header.total_nbytes);
  maybe_replace(input, keep, 11, header.checksum);
  if ((keep >> 12 & 1) == 0) header.checksum = ring_header_checksum(header);
  std::memcpy(peer_payload, &header, sizeof(header));

  std::unique_ptr<SlotRing> producer;
  if (!tensorxfer::fuzz::accepted("SlotRing::attach", [&] { producer = SlotRing::attach(consumer.name()); })) return;
  // Accepted: it must describe the ring that is really there.
  TENSORXFER_FUZZ_EXPECT(producer->depth() == layout.depth && producer->slot_nbytes() == layout.slot_nbytes &&
                             producer->max_producers() == layout.max_producers,
                         "attach accepted a header describing another layout (depth ", producer->depth(),
                         ", slot_nbytes ", producer->slot_nbytes(), ", max_producers ", producer->max_producers(), ")");
  std::optional<uint32_t> slot;
  if (tensorxfer::fuzz::accepted("try_acquire_free", [&] { slot = producer->try_acquire_free(); }) && slot) {
    touch_slot(*producer, *slot);
    tensorxfer::fuzz::accepted("publish", [&] { producer->publish(*slot, 7); });
  }
}

void table_mode(FuzzInput& input, SlotRing& consumer, const RingLayout& layout, std::byte* peer_payload) {
  // A real producer first, so entries and slots hold real states before the peer's writes.
  std::unique_ptr<SlotRing> producer;
  if (!tensorxfer::fuzz::accepted("SlotRing::attach", [&] { producer = SlotRing::attach(consumer.name()); })) return;
  const uint8_t setup = input.take<uint8_t>();
  for (int i = 0; i < (setup & 3); ++i) {
    std::optional<uint32_t> slot;
    if (!tensorxfer::fuzz::accepted("try_acquire_free", [&] { slot = producer->try_acquire_free(); }) || !slot) break;
    if ((setup >> (2 + i) & 1) != 0) tensorxfer::fuzz::accepted("publish", [&] { producer->publish(*slot, i); });
  }

  // The peer's writes: (region, index, word) triples until the input says stop.
  auto* control = reinterpret_cast<RingControl*>(peer_payload + kRingControlOffset);
  auto* producers = reinterpret_cast<ProducerEntry*>(peer_payload + layout.producers_offset);
  auto* slots = reinterpret_cast<SlotEntry*>(peer_payload + layout.slot_entries_offset);
  auto* order = reinterpret_cast<sync::SharedWord64*>(peer_payload + layout.order_offset);
  const int writes = input.take_in<int>(0, 12);
  for (int w = 0; w < writes && !input.empty(); ++w) {
    const uint8_t where = input.take<uint8_t>();
    const uint32_t index = input.take<uint8_t>();
    switch (where % 8) {
      case 0: control->publish_counter.store(index < 128 ? index : input.take<uint64_t>(), std::memory_order_release); break;
      case 1: control->producers_claimed.store(index < 200 ? index % 8 : input.take<uint32_t>(), std::memory_order_release); break;
      case 2: control->consumer_state.store(index % 4, std::memory_order_release); break;
      case 3: producers[index % layout.max_producers].state.store(take_word(input), std::memory_order_release); break;
      case 4: producers[index % layout.max_producers].claim.store(input.take<uint8_t>(), std::memory_order_release); break;
      case 5: slots[index % layout.depth].state.store(take_word(input), std::memory_order_release); break;
      case 6: slots[index % layout.depth].tick_id.store(input.take<uint64_t>(), std::memory_order_release); break;
      case 7: order[index % layout.depth].store(
                  (where & 0x80) != 0 ? input.take<uint64_t>() : encode_order_cell(input.take<uint8_t>(), index % 16),
                  std::memory_order_release);
              break;
    }
  }

  // The calls, in the order the input gives, each reading what the peer left.
  const int calls = input.take_in<int>(1, 10);
  for (int c = 0; c < calls; ++c) {
    const uint8_t call = input.take<uint8_t>();
    switch (call % 6) {
      case 0: {
        std::optional<ReadySlot> ready;
        if (tensorxfer::fuzz::accepted("try_acquire_ready", [&] { ready = consumer.try_acquire_ready(); }) && ready) {
          touch_slot(consumer, ready->slot);
          tensorxfer::fuzz::accepted("release", [&] { consumer.release(ready->slot); });
        }
        break;
      }
      case 1: {
        // A zero timeout still runs the peer watch once (reaping, skipping gaps).
        ReadySlot ready;
        if (tensorxfer::fuzz::accepted("acquire_ready", [&] { ready = consumer.acquire_ready(std::chrono::nanoseconds(0)); })) {
          touch_slot(consumer, ready.slot);
        }
        break;
      }
      case 2:
        tensorxfer::fuzz::accepted("release", [&] { consumer.release(call >> 3); });
        break;
      case 3: {
        uint32_t slot = 0;
        if (tensorxfer::fuzz::accepted("acquire_free", [&] { slot = producer->acquire_free(std::chrono::nanoseconds(0)); })) {
          touch_slot(*producer, slot);
          if ((call & 0x80) != 0) {
            tensorxfer::fuzz::accepted("abandon", [&] { producer->abandon(slot); });
          } else {
            tensorxfer::fuzz::accepted("publish", [&] { producer->publish(slot, call); });
          }
        }
        break;
      }
      case 4:
        tensorxfer::fuzz::accepted("live_producers", [&] { (void)consumer.live_producers(); });
        break;
      case 5: {
        // Another producer attaching reads the entries (reuse, generations).
        std::unique_ptr<SlotRing> other;
        tensorxfer::fuzz::accepted("SlotRing::attach", [&] { other = SlotRing::attach(consumer.name()); });
        break;
      }
    }
  }
  producer->close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  const uint8_t mode = input.take<uint8_t>();
  const uint32_t depth = input.take_in<uint32_t>(1, 8);
  const uint64_t slot_nbytes = input.take_in<uint64_t>(1, 3 * 4096);
  const uint32_t max_producers = input.take_in<uint32_t>(1, 4);
  std::unique_ptr<SlotRing> consumer;
  if (!tensorxfer::fuzz::accepted("SlotRing::create", [&] {
        consumer = SlotRing::create(depth, slot_nbytes, sync::SpinPolicy::fixed(std::chrono::microseconds(0)),
                                    max_producers);
      })) {
    return 0;
  }
  const RingLayout layout = RingLayout::compute(depth, slot_nbytes, max_producers, false);
  {
    PeerMapping peer(consumer->name(), layout.total_nbytes);
    if (peer.payload() == nullptr) return 0;
    if ((mode & 1) == 0) {
      header_mode(input, *consumer, layout, peer.payload());
    } else {
      table_mode(input, *consumer, layout, peer.payload());
    }
  }
  consumer->close();
  return 0;
}
