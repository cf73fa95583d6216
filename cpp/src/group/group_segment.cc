#include "tensorxfer/group/group_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"

namespace tensorxfer::group {
namespace {

constexpr const char* kShmDirectory = "/dev/shm";
constexpr const char* kSegmentPrefix = "tensorxfer-group-";  // group_segment_name() without the '/'

bool read_exactly(int fd, void* destination, std::size_t nbytes) noexcept {
  auto* bytes = static_cast<char*>(destination);
  std::size_t filled = 0;
  while (filled < nbytes) {
    const ssize_t got = ::pread(fd, bytes + filled, nbytes - filled, static_cast<off_t>(filled));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    filled += static_cast<std::size_t>(got);
  }
  return true;
}

std::byte* map_shared(int fd, std::size_t nbytes, const std::string& path) {
  void* base = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) throw_system_error("mmap(" + path + ")");
  return static_cast<std::byte*>(base);
}

// An unnamed file in /dev/shm (O_TMPFILE), or one under a private random name
// (returned in `temporary_path`, to be unlinked after publishing).
FileDescriptor open_unnamed_file(std::string& temporary_path) {
  FileDescriptor fd(::open(kShmDirectory, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd.valid()) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL && errno != ENOENT) {
    throw_system_error(std::string("open(") + kShmDirectory + ", O_TMPFILE)");
  }
  for (int attempt = 0; attempt < 8; ++attempt) {
    uint64_t random = 0;
    if (::getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) throw_system_error("getrandom");
    temporary_path = std::string(kShmDirectory) + "/tensorxfer-group-tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(random);
    fd = FileDescriptor(::open(temporary_path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (fd.valid()) return fd;
    if (errno != EEXIST) throw_system_error("open(" + temporary_path + ")");
  }
  throw_system_error("open(" + temporary_path + ")");
}

}  // namespace

GroupSegment::GroupSegment(std::string path, FileDescriptor fd, std::byte* base, std::size_t nbytes, int world_size,
                           uint64_t mailbox_nbytes)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      base_(base),
      nbytes_(nbytes),
      world_size_(world_size),
      mailbox_nbytes_(mailbox_nbytes),
      mapped_by_(::getpid()) {}

GroupSegment::~GroupSegment() {
  member_lock_.release();
  ::munmap(base_, nbytes_);
}

std::unique_ptr<GroupSegment> GroupSegment::open_existing(const std::string& group_name) {
  const std::string path = kShmDirectory + group_segment_name(group_name);
  return open_path(path, &group_name, "LocalGroup '" + group_name + "' (" + path + ")");
}

std::unique_ptr<GroupSegment> GroupSegment::open_path(const std::string& path, const std::string* group_name,
                                                      const std::string& context) {
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return nullptr;
    throw_system_error("open(" + path + ")");
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw_system_error("fstat(" + path + ")");
  TENSORXFER_CHECK(InvalidArgument, info.st_uid == ::geteuid(), context, ": the segment belongs to uid ", info.st_uid,
                   ", not to this user (uid ", ::geteuid(), "); refusing another user's group");
  TENSORXFER_CHECK(CorruptSegment, S_ISREG(info.st_mode), context, ": not a regular file");
  TENSORXFER_CHECK(InvalidArgument, (info.st_mode & 077) == 0, context, ": mode is 0", std::oct,
                   (info.st_mode & 0777), ", expected 0600; refusing a segment others can access");
  const auto file_nbytes = static_cast<std::size_t>(info.st_size);
  TENSORXFER_CHECK(CorruptSegment, file_nbytes >= kSlotsOffset, context, ": segment is ", file_nbytes,
                   " bytes, expected at least ", kSlotsOffset, " (truncated?)");
  GroupHeader header;
  TENSORXFER_CHECK(CorruptSegment, read_exactly(fd.get(), &header, sizeof(header)), context,
                   ": cannot read the header");
  validate_group_header(header, file_nbytes, context);
  if (group_name != nullptr) {
    TENSORXFER_CHECK(InvalidArgument,
                     std::string_view(header.name, header.name_nbytes) == std::string_view(*group_name), context,
                     ": the segment holds group '", std::string(header.name, header.name_nbytes),
                     "' (a segment-name collision); choose another name");
  }
  std::byte* base = map_shared(fd.get(), file_nbytes, path);
  return std::unique_ptr<GroupSegment>(new GroupSegment(path, std::move(fd), base, file_nbytes,
                                                        static_cast<int>(header.world_size), header.mailbox_nbytes));
}

std::size_t GroupSegment::sweep_dead_groups() noexcept {
  std::vector<std::string> paths;
  if (DIR* directory = ::opendir(kShmDirectory)) {
    const std::string prefix = std::string(kSegmentPrefix);
    while (const dirent* entry = ::readdir(directory)) {
      const std::string file = entry->d_name;
      if (file.compare(0, prefix.size(), prefix) == 0 && file.compare(0, prefix.size() + 4, prefix + "tmp-") != 0) {
        paths.push_back(std::string(kShmDirectory) + "/" + file);
      }
    }
    ::closedir(directory);
  }
  std::size_t removed = 0;
  for (const std::string& path : paths) {
    try {
      const auto segment = open_path(path, nullptr, "sweep " + path);
      if (segment && segment->unlink_if_unused()) ++removed;
    } catch (...) {
      // Another user's, damaged, or unreadable: never remove what we cannot validate.
    }
  }
  return removed;
}

std::unique_ptr<GroupSegment> GroupSegment::create_with_member(const std::string& group_name, int world_size,
                                                               int rank, uint64_t mailbox_nbytes) {
  (void)sweep_dead_groups();
  const std::string path = kShmDirectory + group_segment_name(group_name);
  const GroupHeader header = make_group_header(group_name, world_size, mailbox_nbytes);
  const auto nbytes = static_cast<std::size_t>(header.total_nbytes);
  const auto self = static_cast<int32_t>(::getpid());

  std::string temporary_path;
  FileDescriptor fd = open_unnamed_file(temporary_path);
  struct TemporaryName {
    std::string& path;
    ~TemporaryName() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } temporary_name{temporary_path};
  // The umask may have narrowed the mode; make it exactly 0600.
  if (::fchmod(fd.get(), 0600) != 0) throw_system_error("fchmod(" + path + ", 0600)");
  if (::ftruncate(fd.get(), static_cast<off_t>(nbytes)) != 0) throw_system_error("ftruncate(" + path + ")");
  // Reserve the pages now: a full /dev/shm fails here with ENOSPC instead of a later SIGBUS.
  const int reserve_error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(nbytes));
  if (reserve_error != 0 && reserve_error != EOPNOTSUPP && reserve_error != EINVAL) {
    throw SystemError("posix_fallocate(" + path + ", " + std::to_string(nbytes) + " bytes)", reserve_error);
  }
  std::byte* base = map_shared(fd.get(), nbytes, path);
  const int raw_fd = fd.get();
  std::unique_ptr<GroupSegment> segment(new GroupSegment(path, std::move(fd), base, nbytes, world_size, mailbox_nbytes));
  // Nobody else can see the file yet: plain initialisation, published by link() below.
  std::memcpy(segment->base_, &header, sizeof(header));
  std::optional<sync::LivenessLock> lock = sync::LivenessLock::try_hold(raw_fd, static_cast<uint32_t>(rank));
  if (!lock) throw SystemError("LocalGroup: the liveness lock of a new, private segment is taken", EBUSY);
  segment->member_lock_ = std::move(*lock);
  segment->slot(rank).claim.store(encode_claim(MemberState::kJoined, self), std::memory_order_relaxed);
  segment->control().joined_count.store(1, std::memory_order_relaxed);

  const std::string source = temporary_path.empty() ? "/proc/self/fd/" + std::to_string(raw_fd) : temporary_path;
  const int flags = temporary_path.empty() ? AT_SYMLINK_FOLLOW : 0;
  if (::linkat(AT_FDCWD, source.c_str(), AT_FDCWD, path.c_str(), flags) != 0) {
    if (errno == EEXIST) return nullptr;
    throw_system_error("link(" + source + ", " + path + ")");
  }
  return segment;
}

GroupControl& GroupSegment::control() const noexcept {
  return *reinterpret_cast<GroupControl*>(base_ + kControlOffset);
}

RankSlot& GroupSegment::slot(int rank) const noexcept {
  return reinterpret_cast<RankSlot*>(base_ + kSlotsOffset)[rank];
}

MailboxHeader& GroupSegment::mailbox_header(int rank, int which) const noexcept {
  return *reinterpret_cast<MailboxHeader*>(base_ + mailbox_buffer_offset(world_size_, mailbox_nbytes_, rank, which));
}

std::byte* GroupSegment::mailbox_data(int rank, int which) const noexcept {
  return base_ + mailbox_buffer_offset(world_size_, mailbox_nbytes_, rank, which) + kMailboxHeaderBytes;
}

Claim GroupSegment::claim_of(int rank) const {
  // acquire: a kJoined claim publishes the member's start_ticks written before it.
  return decode_claim(slot(rank).claim.load(std::memory_order_acquire), rank, path_);
}

GroupSegment::MemberStatus GroupSegment::status_of(int rank) const {
  const Claim claim = claim_of(rank);
  switch (claim.state) {
    case MemberState::kFree: return MemberStatus::kFree;
    case MemberState::kLeft: return MemberStatus::kLeft;
    default: break;
  }
  if (sync::liveness_held(fd_.get(), static_cast<uint32_t>(rank))) return MemberStatus::kAlive;
  // A leaver marks kLeft before dropping its lock: look again so a close is not taken for an exit.
  const Claim again = claim_of(rank);
  if (again.state == MemberState::kLeft) return MemberStatus::kLeft;
  if (again.state == MemberState::kFree) return MemberStatus::kFree;  // a withdrawn claim
  if (again.pid != claim.pid) return status_of(rank);                  // withdrawn and claimed anew
  return MemberStatus::kExited;
}

std::string GroupSegment::describe_member(int rank) const {
  const Claim claim = claim_of(rank);
  if (claim.state == MemberState::kFree) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(claim.pid) + ")";
}

GroupSegment::Survey GroupSegment::survey() const {
  Survey result;
  for (int rank = 0; rank < world_size_; ++rank) {
    switch (status_of(rank)) {
      case MemberStatus::kFree: result.free.push_back(rank); break;
      case MemberStatus::kLeft: result.left.push_back(rank); break;
      case MemberStatus::kExited: result.dead.push_back(rank); break;
      case MemberStatus::kAlive: ++result.live; break;
    }
  }
  return result;
}

GroupSegment::ClaimResult GroupSegment::try_claim(int rank) {
  // The lock first: a claim is never visible without a live holder behind it.
  std::optional<sync::LivenessLock> lock = sync::LivenessLock::try_hold(fd_.get(), static_cast<uint32_t>(rank));
  if (!lock) return ClaimResult::kTakenByLiveProcess;
  uint64_t expected = 0;
  // seq_cst: the claim must be visible to a condemner before we read the group
  // state in condemned() (store-load ordering, see the header).
  if (!slot(rank).claim.compare_exchange(expected, encode_claim(MemberState::kClaimed, ::getpid()),
                                         std::memory_order_seq_cst)) {
    return ClaimResult::kRetry;  // a dead member's slot: the caller looks at the group again
  }
  member_lock_ = std::move(*lock);
  return ClaimResult::kClaimed;
}

bool GroupSegment::condemned() const noexcept {
  // seq_cst: pairs with try_claim's and unlink_if_unused's seq_cst accesses.
  return control().state.load(std::memory_order_seq_cst) != kGroupOpen;
}

void GroupSegment::withdraw_claim(int rank) noexcept {
  // release: nothing was published under the claim; orders the withdrawal after it.
  slot(rank).claim.store(0, std::memory_order_release);
  member_lock_.release();
  control().membership.notify_all();
}

void GroupSegment::complete_join(int rank) {
  // release: our earlier writes (none needed today) are visible with the joined claim.
  slot(rank).claim.store(encode_claim(MemberState::kJoined, ::getpid()), std::memory_order_release);
  // acq_rel: the count is what join waits for; our joined claim happens-before it.
  control().joined_count.fetch_add(1, std::memory_order_acq_rel);
  control().membership.notify_all();
}

void GroupSegment::mark_left(int rank) noexcept {
  // seq_cst: a condemner that reads the slots after this sees us gone; our
  // barrier epoch and mailbox writes happen-before it (peers that see kLeft
  // re-check their barrier before calling us lost).
  slot(rank).claim.store(encode_claim(MemberState::kLeft, ::getpid()), std::memory_order_seq_cst);
  member_lock_.release();
  control().membership.notify_all();
  control().arrivals.notify_all();
}

bool GroupSegment::name_refers_to_this_file() const noexcept {
  struct stat mine {};
  struct stat named {};
  return ::fstat(fd_.get(), &mine) == 0 && ::stat(path_.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
         mine.st_ino == named.st_ino;
}

bool GroupSegment::unlink_if_unused() noexcept {
  try {
    if (survey().live > 0) return false;
    const std::optional<sync::LivenessLock> condemner = sync::LivenessLock::try_hold(fd_.get(), kCondemnerParticipant);
    if (!condemner) return false;  // someone else is removing it right now
    // seq_cst: see the header (a joiner's claim vs our survey below).
    control().state.store(kGroupCondemned, std::memory_order_seq_cst);
    if (survey().live > 0) {
      control().state.store(kGroupOpen, std::memory_order_seq_cst);  // a joiner keeps the segment
      return false;
    }
    // An earlier condemner may have unlinked it already (and a new group taken the name).
    if (!name_refers_to_this_file()) return false;
    ::unlink(path_.c_str());
    return true;
  } catch (...) {
    return false;  // corrupt slots or no answer from the kernel: leave the name for a joiner to report
  }
}

}  // namespace tensorxfer::group
