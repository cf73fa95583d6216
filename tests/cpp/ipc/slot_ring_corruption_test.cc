// ctest-labels: concurrent
// Randomized corruption of segment and ring headers, state words and sizes:
// attach and every ring operation must either work or throw a tensorxfer
// error (CorruptSegment for what fails validation), never crash or touch
// memory out of bounds. Run under ASan+UBSan in CI.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>

#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

using namespace std::chrono_literals;

// A second, independent mapping of a segment's file: the "hostile peer".
class RawMapping {
 public:
  explicit RawMapping(const std::string& name) {
    fd_ = FileDescriptor(::shm_open(name.c_str(), O_RDWR, 0));
    if (!fd_.valid()) throw std::runtime_error("shm_open");
    struct stat info {};
    if (::fstat(fd_.get(), &info) != 0) throw std::runtime_error("fstat");
    nbytes_ = static_cast<std::size_t>(info.st_size);
    void* base = ::mmap(nullptr, nbytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap");
    base_ = static_cast<unsigned char*>(base);
  }
  ~RawMapping() { ::munmap(base_, nbytes_); }
  unsigned char* bytes() const { return base_; }
  unsigned char* payload() const { return base_ + memory::kSegmentHeaderBytes; }
  std::size_t nbytes() const { return nbytes_; }
  void truncate(off_t nbytes) const {
    if (::ftruncate(fd_.get(), nbytes) != 0) throw std::runtime_error("ftruncate");
  }

 private:
  FileDescriptor fd_;
  unsigned char* base_ = nullptr;
  std::size_t nbytes_ = 0;
};

enum class Outcome { kWorked, kRefused };

// Runs attach and a round of operations; returns whether everything worked or
// was refused with a tensorxfer error. Any other exception fails the test.
Outcome exercise(SlotRing& consumer) {
  try {
    auto producer = SlotRing::attach(consumer.name(), sync::SpinPolicy::fixed(0us));
    (void)producer->live_producers();
    if (auto slot = producer->try_acquire_free()) {
      std::memset(producer->slot_data(*slot), 1, producer->slot_nbytes());
      producer->publish(*slot, 5);
    }
    for (int i = 0; i < 3; ++i) {
      if (auto ready = consumer.try_acquire_ready()) {
        (void)consumer.slot_data(ready->slot)[0];
        consumer.release(ready->slot);
      }
    }
    (void)consumer.acquire_ready(1ms);
    return Outcome::kWorked;
  } catch (const Timeout&) {
    return Outcome::kWorked;
  } catch (const Error&) {  // CorruptSegment, InvalidArgument, PeerLost, SystemError
    return Outcome::kRefused;
  }
}

TEST(SlotRingCorruptionTest, EverySegmentHeaderByteIsValidated) {
  std::mt19937 random(12345);
  for (std::size_t offset = 0; offset < offsetof(memory::SegmentHeader, attach_count); ++offset) {
    auto consumer = SlotRing::create(2, 64);
    RawMapping raw(consumer->name());
    raw.bytes()[offset] ^= static_cast<unsigned char>(1 + random() % 255);
    try {
      (void)SlotRing::attach(consumer->name());
      ADD_FAILURE() << "attach accepted a segment header changed at byte " << offset;
    } catch (const CorruptSegment&) {
    }
  }
}

TEST(SlotRingCorruptionTest, EveryRingHeaderByteIsValidated) {
  std::mt19937 random(777);
  for (std::size_t offset = 0; offset < sizeof(RingHeader); ++offset) {
    auto consumer = SlotRing::create(3, 100);
    RawMapping raw(consumer->name());
    raw.payload()[offset] ^= static_cast<unsigned char>(1 + random() % 255);
    try {
      (void)SlotRing::attach(consumer->name());
      ADD_FAILURE() << "attach accepted a ring header changed at byte " << offset;
    } catch (const CorruptSegment&) {
    }
  }
}

TEST(SlotRingCorruptionTest, ConsistentlyForgedHeadersAreStillBoundedByTheFileSize) {
  // A peer that recomputes the checksums after lying about the depth.
  auto consumer = SlotRing::create(2, 64);
  RawMapping raw(consumer->name());
  RingHeader header;
  std::memcpy(&header, raw.payload(), sizeof(header));
  header.depth = 1000;
  header.checksum = ring_header_checksum(header);
  std::memcpy(raw.payload(), &header, sizeof(header));
  EXPECT_THROW((void)SlotRing::attach(consumer->name()), CorruptSegment);
}

TEST(SlotRingCorruptionTest, TruncatedSegmentsAreRefused) {
  auto consumer = SlotRing::create(2, 5000);
  RawMapping raw(consumer->name());
  const std::size_t full = raw.nbytes();
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{71}, std::size_t{4095},
                                 std::size_t{4096}, std::size_t{4096 + 100}, full - 1, full + 4096}) {
    raw.truncate(static_cast<off_t>(size));
    EXPECT_THROW((void)SlotRing::attach(consumer->name()), CorruptSegment) << "size " << size;
  }
  // Growing it back does not bring the discarded header back.
  raw.truncate(static_cast<off_t>(full));
  EXPECT_THROW((void)SlotRing::attach(consumer->name()), CorruptSegment);
  EXPECT_EQ(exercise(*consumer), Outcome::kRefused);
}

TEST(SlotRingCorruptionTest, GarbageStateWordsAreReportedNotFollowed) {
  auto consumer = SlotRing::create(4, 64);
  RawMapping raw(consumer->name());
  RingHeader header;
  std::memcpy(&header, raw.payload(), sizeof(header));
  auto* slots = reinterpret_cast<SlotEntry*>(raw.payload() + header.slot_entries_offset);
  slots[2].state.store(0xDEADBEEFDEADBE99ull, std::memory_order_relaxed);  // unknown state 0x99
  auto producer = SlotRing::attach(consumer->name());
  EXPECT_THROW(
      {
        for (int i = 0; i < 4; ++i) (void)producer->acquire_free(10ms);
      },
      CorruptSegment);
  // READY naming a producer index beyond max_producers.
  slots[2].state.store(SlotWord{SlotState::kReady, 200, 0}.encode(), std::memory_order_relaxed);
  auto* control = reinterpret_cast<RingControl*>(raw.payload() + kRingControlOffset);
  control->publish_counter.store(1, std::memory_order_relaxed);  // so the consumer looks for sequence 0
  EXPECT_THROW((void)consumer->try_acquire_ready(), CorruptSegment);
}

TEST(SlotRingCorruptionTest, ForgedCountersAreReportedNotFollowed) {
  auto consumer = SlotRing::create(2, 64);
  RawMapping raw(consumer->name());
  auto* control = reinterpret_cast<RingControl*>(raw.payload() + kRingControlOffset);
  control->publish_counter.store(uint64_t{1} << 40, std::memory_order_relaxed);
  EXPECT_THROW((void)consumer->try_acquire_ready(), CorruptSegment);
  control->publish_counter.store(0, std::memory_order_relaxed);
  control->producers_claimed.store(100000, std::memory_order_relaxed);
  EXPECT_THROW((void)consumer->live_producers(), CorruptSegment);
  EXPECT_THROW((void)SlotRing::attach(consumer->name()), CorruptSegment);
  control->producers_claimed.store(0, std::memory_order_relaxed);
  control->consumer_state.store(77, std::memory_order_relaxed);
  EXPECT_THROW((void)SlotRing::attach(consumer->name()), CorruptSegment);
}

TEST(SlotRingCorruptionTest, RandomizedMetadataCorruptionNeverCrashes) {
  std::mt19937_64 random(20261122);
  int worked = 0;
  int refused = 0;
  for (int iteration = 0; iteration < 300; ++iteration) {
    auto consumer = SlotRing::create(1 + static_cast<uint32_t>(random() % 4), 1 + random() % 9000,
                                     sync::SpinPolicy::fixed(0us), 1 + static_cast<uint32_t>(random() % 4));
    RawMapping raw(consumer->name());
    // Ring metadata: everything before the first slot, segment header included.
    RingHeader header;
    std::memcpy(&header, raw.payload(), sizeof(header));
    const std::size_t metadata = memory::kSegmentHeaderBytes + header.slots_offset;
    const int flips = 1 + static_cast<int>(random() % 8);
    for (int flip = 0; flip < flips; ++flip) {
      const std::size_t offset = random() % metadata;
      raw.bytes()[offset] = static_cast<unsigned char>(random());
    }
    if (exercise(*consumer) == Outcome::kWorked) {
      ++worked;
    } else {
      ++refused;
    }
  }
  // Most single-byte hits land in unused padding; both outcomes must occur.
  EXPECT_GT(worked, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace tensorxfer::ipc
