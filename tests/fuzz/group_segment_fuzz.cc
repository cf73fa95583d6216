// The local group's segment, as a dead job or a peer leaves it.
//
//   file mode     the whole segment under the group's name is the input (a
//                 header kept or replaced field by field, checksum recomputed
//                 on request, the rank slots' words, a file size that may
//                 lie): GroupSegment::open_existing and the member survey
//                 decode it, then LocalGroup::join meets it.
//   mailbox mode  a real two-rank group in this process; rank 1's words (its
//                 claim, barrier epoch, gave-up flag) and both of its
//                 all_gather mailboxes (header and data) are the input, and
//                 rank 0 runs all_gather_bytes and barrier over them.
//
// Contract (group_layout.h, local_group.h): every value read from the segment
// is validated before use; a bad one is CorruptSegment. Calls return or throw a
// tensorxfer::Error; all_gather_bytes returns each rank's announced bytes, and
// never allocates more than max_nbytes for a peer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "fuzz_support.h"
#include "tensorxfer/group/group_layout.h"
#include "tensorxfer/group/group_segment.h"
#include "tensorxfer/group/local_group.h"

namespace {

using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::group;
using std::chrono::milliseconds;

constexpr uint64_t kMaxGather = 256 * 1024;  // max_nbytes this target passes

std::string group_name() { return "fuzz-" + std::to_string(::getpid()); }
std::string group_path() { return "/dev/shm" + group_segment_name(group_name()); }

template <typename T>
void maybe_replace(FuzzInput& input, uint32_t keep_mask, int bit, T& field) {
  if ((keep_mask >> bit & 1) == 0) input.take_into(&field, sizeof(field));
}

class FileMapping {
 public:
  FileMapping(const std::string& path, std::size_t nbytes) : nbytes_(nbytes) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void* base = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base != MAP_FAILED) base_ = static_cast<std::byte*>(base);
  }
  ~FileMapping() {
    if (base_ != nullptr) ::munmap(base_, nbytes_);
  }
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  std::byte* base() const { return base_; }

 private:
  std::size_t nbytes_;
  std::byte* base_ = nullptr;
};

uint64_t take_claim(FuzzInput& input) {
  const uint8_t tag = input.take<uint8_t>();
  if ((tag & 0x80) != 0) return input.take<uint64_t>();
  const int32_t pids[] = {0, static_cast<int32_t>(::getpid()), 1, 0x7FFFFFFF};
  return encode_claim(static_cast<MemberState>(tag & 3), pids[tag >> 2 & 3]);
}

void file_mode(FuzzInput& input) {
  const std::string path = group_path();
  (void)::unlink(path.c_str());
  const int world_size = input.take_in<int>(1, 4);
  const uint64_t mailbox_nbytes = input.take_in<uint64_t>(1, 8192);
  GroupHeader header = make_group_header(group_name(), world_size, mailbox_nbytes);
  const uint32_t keep = input.take<uint32_t>();
  maybe_replace(input, keep, 0, header.magic);
  maybe_replace(input, keep, 1, header.layout_version);
  maybe_replace(input, keep, 2, header.world_size);
  maybe_replace(input, keep, 3, header.total_nbytes);
  maybe_replace(input, keep, 4, header.mailbox_nbytes);
  maybe_replace(input, keep, 5, header.name_nbytes);
  maybe_replace(input, keep, 6, header.reserved);
  if ((keep >> 7 & 1) == 0) header.name[input.take<uint8_t>() % kGroupNameCapacity] = input.take<char>();
  maybe_replace(input, keep, 8, header.checksum);
  if ((keep >> 9 & 1) == 0) header.checksum = group_header_checksum(header);
  // The file's size: the header's claim (bounded: a sparse file, but mapped whole), or another.
  std::size_t file_nbytes = header.total_nbytes <= (std::size_t{1} << 30) ? header.total_nbytes : kSlotsOffset;
  if ((keep >> 10 & 1) == 0) file_nbytes = input.take_in<std::size_t>(0, kSlotsOffset + 8 * sizeof(RankSlot) + 4096);

  {
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    const bool written = ::ftruncate(fd, static_cast<off_t>(file_nbytes)) == 0 &&
                         ::pwrite(fd, &header, std::min(sizeof(header), file_nbytes), 0) >= 0;
    // Rank slots: claims, epochs, gave-up flags, where the file has room for them.
    const int slots = input.take_in<int>(0, 8);
    for (int r = 0; written && r < slots; ++r) {
      RankSlot slot;
      std::memset(&slot, 0, sizeof(slot));
      slot.claim.store(take_claim(input), std::memory_order_relaxed);
      slot.barrier_epoch.store(input.take<uint8_t>(), std::memory_order_relaxed);
      slot.gave_up.store(input.take<uint8_t>() & 1, std::memory_order_relaxed);
      const off_t at = static_cast<off_t>(kSlotsOffset + static_cast<std::size_t>(r) * sizeof(RankSlot));
      if (static_cast<std::size_t>(at) + sizeof(slot) <= file_nbytes) (void)::pwrite(fd, &slot, sizeof(slot), at);
    }
    ::close(fd);
  }

  std::unique_ptr<GroupSegment> segment;
  if (tensorxfer::fuzz::accepted("GroupSegment::open_existing", [&] { segment = GroupSegment::open_existing(group_name()); }) &&
      segment != nullptr) {
    TENSORXFER_FUZZ_EXPECT(segment->world_size() >= 1 && segment->world_size() <= kGroupMaxWorldSize &&
                               group_segment_nbytes(segment->world_size(), segment->mailbox_nbytes()) == file_nbytes,
                           "open_existing accepted world_size ", segment->world_size(), " and mailbox ",
                           segment->mailbox_nbytes(), " for a file of ", file_nbytes, " bytes");
    tensorxfer::fuzz::accepted("survey", [&] { (void)segment->survey(); });
    for (int r = 0; r < segment->world_size() && r < 8; ++r) {
      tensorxfer::fuzz::accepted("status_of", [&] { (void)segment->status_of(r); });
      tensorxfer::fuzz::accepted("describe_member", [&] { (void)segment->describe_member(r); });
    }
  }
  segment.reset();
  // A rank arriving at what the file holds.
  std::unique_ptr<LocalGroup> joined;
  const int join_world = input.take_in<int>(1, 2);
  tensorxfer::fuzz::accepted("LocalGroup::join",
                             [&] { joined = LocalGroup::join(group_name(), 0, join_world, milliseconds(1)); });
  if (joined) joined->close();
  (void)::unlink(path.c_str());
}

void mailbox_mode(FuzzInput& input) {
  (void)::unlink(group_path().c_str());
  std::unique_ptr<LocalGroup> rank0, rank1;
  std::thread peer([&] {
    tensorxfer::fuzz::accepted("LocalGroup::join", [&] { rank1 = LocalGroup::join(group_name(), 1, 2, milliseconds(2000)); });
  });
  tensorxfer::fuzz::accepted("LocalGroup::join", [&] { rank0 = LocalGroup::join(group_name(), 0, 2, milliseconds(2000)); });
  peer.join();
  if (!rank0 || !rank1) return;
  const uint64_t mailbox = LocalGroup::kMailboxBytes;
  const std::size_t nbytes = group_segment_nbytes(2, mailbox);
  FileMapping file(group_path(), nbytes);
  if (file.base() == nullptr) return;

  // Rank 1's contribution as its process would leave it, or as a broken one does.
  MailboxHeader announced[2];
  for (int which = 0; which < 2; ++which) {
    auto* header = reinterpret_cast<MailboxHeader*>(file.base() + mailbox_buffer_offset(2, mailbox, 1, which));
    const uint8_t tag = input.take<uint8_t>();
    header->total_nbytes = (tag & 1) != 0 ? input.take<uint64_t>() : input.take<uint16_t>() * static_cast<uint64_t>((tag >> 1 & 3) + 1);
    header->round = (tag & 8) != 0 ? input.take<uint64_t>() : uint64_t(which);
    announced[which] = *header;
    std::byte* data = file.base() + mailbox_buffer_offset(2, mailbox, 1, which) + kMailboxHeaderBytes;
    std::memset(data, 0x30 + which, mailbox);
    input.take_into(data, input.take_in<std::size_t>(0, 64));
  }
  auto* slot = reinterpret_cast<RankSlot*>(file.base() + kSlotsOffset + sizeof(RankSlot));
  const uint8_t words = input.take<uint8_t>();
  slot->barrier_epoch.store((words & 3) == 3 ? input.take<uint64_t>() : words & 3, std::memory_order_release);
  slot->gave_up.store(words >> 2 & 1, std::memory_order_release);
  if ((words & 0x10) != 0) slot->claim.store(take_claim(input), std::memory_order_release);

  const std::string mine(input.take_in<std::size_t>(0, 100), 'm');
  std::vector<std::string> gathered;
  if ((words & 0x20) != 0) {
    tensorxfer::fuzz::accepted("LocalGroup::barrier", [&] { rank0->barrier(milliseconds(1)); });
  } else if (tensorxfer::fuzz::accepted("all_gather_bytes", [&] {
               gathered = rank0->all_gather_bytes(mine, milliseconds(1), {}, kMaxGather);
             })) {
    TENSORXFER_FUZZ_EXPECT(gathered.size() == 2 && gathered[0] == mine, "own contribution returned");
    const uint64_t total = announced[0].total_nbytes;
    TENSORXFER_FUZZ_EXPECT(total <= kMaxGather && gathered[1].size() == total, "rank 1 announced ", total,
                           " bytes, all_gather_bytes returned ", gathered[1].size());
    const std::byte* data = file.base() + mailbox_buffer_offset(2, mailbox, 1, 0) + kMailboxHeaderBytes;
    TENSORXFER_FUZZ_EXPECT(std::memcmp(gathered[1].data(), data, std::min<uint64_t>(total, mailbox)) == 0,
                           "rank 1's first round arrives as it was written");
  }
  tensorxfer::fuzz::accepted("rank_alive", [&] { (void)rank0->rank_alive(1); });
  rank0->close();
  rank1->close();
  (void)::unlink(group_path().c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  if ((input.take<uint8_t>() & 1) == 0) {
    file_mode(input);
  } else {
    mailbox_mode(input);
  }
  return 0;
}
