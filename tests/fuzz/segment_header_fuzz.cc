// The shared-segment header, as a peer (or a crashed job, or a stale
// segment) leaves it: the fuzzer's bytes are written over the header of a
// real segment this process created, and ShmSegment::attach maps it by name,
// as every layer above does with a segment another process made.
//
// Each header field is either kept from the real header or replaced by the
// input (so inputs reach the checks after the first), and the checksum is
// recomputed when the input asks: a peer can compute FNV-1a as well as we
// can, so the checks after it must hold on their own.
//
// Contract (shm_segment.h): attach throws CorruptSegment, SystemError or
// PeerLost, or returns a segment whose payload lies inside the file and whose
// kind is the one asked for.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "fuzz_support.h"
#include "tensorxfer/memory/shm_segment.h"

namespace {

using tensorxfer::fuzz::FuzzInput;
using tensorxfer::memory::SegmentHeader;
using tensorxfer::memory::ShmSegment;
namespace memory = tensorxfer::memory;

constexpr uint32_t kRing = memory::make_kind_tag("RING");
constexpr uint32_t kArray = memory::make_kind_tag("ARRY");

template <typename T>
void maybe_replace(FuzzInput& input, uint16_t keep_mask, int bit, T& field) {
  if ((keep_mask >> bit & 1) == 0) input.take_into(&field, sizeof(field));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  const uint16_t keep = input.take<uint16_t>();  // bit i set: keep field i of the real header
  const uint8_t flags = input.take<uint8_t>();
  const std::size_t payload_nbytes = input.take_in<std::size_t>(0, 3) * 4096 + input.take_in<std::size_t>(0, 1);
  const uint32_t kinds[] = {0, kRing, kArray, input.take<uint32_t>()};
  const uint32_t expected_kind = kinds[flags >> 1 & 3];

  std::optional<ShmSegment> created;
  if (!tensorxfer::fuzz::accepted("ShmSegment::create", [&] { created.emplace(ShmSegment::create(payload_nbytes, kRing)); })) {
    return 0;  // /dev/shm full or similar: nothing to fuzz
  }
  auto* header = reinterpret_cast<SegmentHeader*>(created->payload() - memory::kSegmentHeaderBytes);
  SegmentHeader fuzzed;
  std::memcpy(&fuzzed, header, sizeof(fuzzed));
  maybe_replace(input, keep, 0, fuzzed.magic);
  maybe_replace(input, keep, 1, fuzzed.layout_version);
  maybe_replace(input, keep, 2, fuzzed.kind_tag);
  maybe_replace(input, keep, 3, fuzzed.header_nbytes);
  maybe_replace(input, keep, 4, fuzzed.payload_nbytes);
  maybe_replace(input, keep, 5, fuzzed.total_nbytes);
  maybe_replace(input, keep, 6, fuzzed.owner);
  maybe_replace(input, keep, 7, fuzzed.immutable_checksum);
  if ((flags & 1) != 0) fuzzed.immutable_checksum = memory::segment_header_checksum(fuzzed);
  uint32_t count = 1;
  if ((keep >> 8 & 1) == 0) count = input.take<uint32_t>();
  maybe_replace(input, keep, 9, fuzzed.reserved);
  // The mutable word through its atomic, the rest as plain bytes (what a peer's stores leave).
  std::memcpy(header, &fuzzed, offsetof(SegmentHeader, attach_count));
  header->attach_count.store(count, std::memory_order_release);
  header->reserved = fuzzed.reserved;

  // The file itself may lie about its size (a truncated or grown segment). Never shorter than the
  // header page: the creator's own detach writes there, and a file cut under a mapping faults on
  // any access (a same-user peer that truncates a segment is not a decoder's concern).
  if ((flags & 0x10) != 0) {
    const int fd = ::shm_open(created->name().c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd >= 0) {
      constexpr auto kHeader = static_cast<off_t>(memory::kSegmentHeaderBytes);
      const off_t sizes[] = {kHeader, kHeader + 1, kHeader + static_cast<off_t>(payload_nbytes / 2),
                             kHeader + static_cast<off_t>(payload_nbytes) + 4096};
      (void)::ftruncate(fd, sizes[flags >> 5 & 3]);
      ::close(fd);
    }
  }

  std::optional<ShmSegment> attached;
  const bool ok = tensorxfer::fuzz::accepted("ShmSegment::attach", [&] {
    attached.emplace(ShmSegment::attach(created->name(), expected_kind));
  });
  if (ok) {
    struct stat info {};
    const int fd = ::shm_open(created->name().c_str(), O_RDONLY | O_CLOEXEC, 0);
    TENSORXFER_FUZZ_EXPECT(fd >= 0 && ::fstat(fd, &info) == 0, "the attached segment's file is there");
    ::close(fd);
    TENSORXFER_FUZZ_EXPECT(attached->payload_nbytes() + memory::kSegmentHeaderBytes ==
                               static_cast<std::size_t>(info.st_size),
                           "attach accepted a payload of ", attached->payload_nbytes(), " bytes in a file of ",
                           static_cast<long long>(info.st_size));
    TENSORXFER_FUZZ_EXPECT(expected_kind == 0 || attached->kind_tag() == expected_kind, "attach accepted kind ",
                           attached->kind_tag(), " when asked for ", expected_kind);
    if (attached->payload_nbytes() != 0) {
      // Every payload byte is mapped: touching the last one must not fault.
      volatile std::byte* last = attached->payload() + attached->payload_nbytes() - 1;
      *last = *last;
    }
  }
  // Detaching with whatever attach count the peer left must not throw or crash either.
  attached.reset();
  created->unlink();
  created.reset();
  return 0;
}
