#include "tensorxfer/memory/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"

namespace tensorxfer::memory {
namespace {

constexpr std::size_t kImmutableBytes = offsetof(SegmentHeader, immutable_checksum);
constexpr std::size_t kMaxNameLength = 200;

std::string random_hex(std::size_t nbytes) {
  unsigned char random[32];
  std::size_t filled = 0;
  while (filled < nbytes) {
    const ssize_t got = ::getrandom(random + filled, nbytes - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_system_error("getrandom");
    }
    filled += static_cast<std::size_t>(got);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  for (std::size_t i = 0; i < nbytes; ++i) {
    text.push_back(kDigits[random[i] >> 4]);
    text.push_back(kDigits[random[i] & 15]);
  }
  return text;
}

// "/tensorxfer-..." from "tensorxfer-..." or "/tensorxfer-...".
std::string canonical_name(const std::string& name) {
  std::string full = (!name.empty() && name[0] == '/') ? name : "/" + name;
  const std::string prefix = std::string("/") + kSegmentNamePrefix;
  bool valid = full.size() > prefix.size() && full.size() <= kMaxNameLength &&
               full.compare(0, prefix.size(), prefix) == 0;
  for (std::size_t i = 1; valid && i < full.size(); ++i) {
    const char c = full[i];
    valid = std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
  }
  TENSORXFER_CHECK(InvalidArgument, valid, "shared segment name must look like '/", kSegmentNamePrefix,
                   "<pid>-<hex>' (letters, digits, '-', '_'; at most ", kMaxNameLength,
                   " characters), got '", name, "'");
  return full;
}

// Reads exactly sizeof(header) bytes at offset 0; false on a short read.
bool read_header(int fd, SegmentHeader& header) noexcept {
  std::size_t filled = 0;
  auto* bytes = reinterpret_cast<char*>(&header);
  while (filled < sizeof(header)) {
    const ssize_t got = ::pread(fd, bytes + filled, sizeof(header) - filled, static_cast<off_t>(filled));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    filled += static_cast<std::size_t>(got);
  }
  return true;
}

void shm_unlink_quietly(const std::string& name) noexcept {
  // ENOENT: someone else removed it first, which is the outcome we want.
  (void)::shm_unlink(name.c_str());
}

}  // namespace

std::string kind_tag_name(uint32_t tag) {
  std::string text;
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xFF);
    if (std::isprint(static_cast<unsigned char>(c)) == 0) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "0x%08x", tag);
      return hex;
    }
    text.push_back(c);
  }
  return "'" + text + "'";
}

uint64_t segment_header_checksum(const SegmentHeader& header) noexcept {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  const auto* bytes = reinterpret_cast<const unsigned char*>(&header);
  for (std::size_t i = 0; i < kImmutableBytes; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void validate_segment_header(const SegmentHeader& header, std::size_t file_nbytes,
                             uint32_t expected_kind, const std::string& context) {
  const char* what = context.c_str();
  TENSORXFER_CHECK(CorruptSegment, header.magic == kSegmentMagic, context,
                   ": not a tensorxfer segment (magic 0x", std::hex, header.magic, ", expected 0x",
                   kSegmentMagic, ")");
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.layout_version, kSegmentLayoutVersion);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.immutable_checksum, segment_header_checksum(header));
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.header_nbytes, kSegmentHeaderBytes);
  TENSORXFER_CHECK_LE(CorruptSegment, what, header.payload_nbytes,
                      std::numeric_limits<uint64_t>::max() - kSegmentHeaderBytes);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, header.header_nbytes + header.payload_nbytes);
  TENSORXFER_CHECK_EQ(CorruptSegment, what, header.total_nbytes, static_cast<uint64_t>(file_nbytes));
  TENSORXFER_CHECK(CorruptSegment, header.owner.pid > 0 && header.owner.reserved == 0, context,
                   ": invalid owner ", header.owner.describe());
  if (expected_kind != 0) {
    TENSORXFER_CHECK(CorruptSegment, header.kind_tag == expected_kind, context, ": segment holds ",
                     kind_tag_name(header.kind_tag), ", expected ", kind_tag_name(expected_kind));
  }
}

// ---- ShmSegment ------------------------------------------------------------------

ShmSegment ShmSegment::create(std::size_t payload_nbytes, uint32_t kind_tag) {
  TENSORXFER_CHECK(InvalidArgument, payload_nbytes <= (std::size_t{1} << 46),
                   "ShmSegment::create: payload_nbytes must be at most 2^46, got ", payload_nbytes);
  (void)sweep_stale_segments();
  const sync::ProcessIdentity self = sync::current_process_identity();
  const std::size_t total = kSegmentHeaderBytes + payload_nbytes;

  std::string name;
  FileDescriptor fd;
  for (int attempt = 0; attempt < 4 && !fd.valid(); ++attempt) {
    name = "/" + std::string(kSegmentNamePrefix) + std::to_string(self.pid) + "-" + random_hex(16);
    fd = FileDescriptor(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) throw_system_error("shm_open(" + name + ", O_CREAT|O_EXCL)");
  }
  if (!fd.valid()) throw_system_error("shm_open(" + name + ", O_CREAT|O_EXCL)");

  ShmSegment segment;
  segment.name_ = name;
  segment.created_ = true;
  segment.file_ = sync::ProcessLocalFd(std::move(fd));
  segment.user_pid_ = self.pid;
  segment.owner_ = self;
  segment.kind_tag_ = kind_tag;
  segment.payload_nbytes_ = payload_nbytes;
  try {
    const int file = segment.file_.get();
    // Before the header is valid: whoever can validate it also finds the lock held.
    std::optional<sync::LivenessLock> creator = sync::LivenessLock::try_hold(file, kSegmentCreatorParticipant);
    if (!creator) throw SystemError("liveness lock of new segment " + name + " is already held", EBUSY);
    segment.creator_lock_ = std::move(*creator);
    // The umask may have narrowed the mode; make it exactly 0600.
    if (::fchmod(file, 0600) != 0) throw_system_error("fchmod(" + name + ", 0600)");
    if (::ftruncate(file, static_cast<off_t>(total)) != 0) throw_system_error("ftruncate(" + name + ")");
    // Reserve the pages now: on a full /dev/shm this fails with ENOSPC instead of a later SIGBUS.
    const int reserve_error = ::posix_fallocate(file, 0, static_cast<off_t>(total));
    if (reserve_error != 0 && reserve_error != EOPNOTSUPP && reserve_error != EINVAL) {
      throw SystemError("posix_fallocate(" + name + ", " + std::to_string(total) + " bytes)", reserve_error);
    }
    void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0);
    if (base == MAP_FAILED) throw_system_error("mmap(" + name + ")");
    segment.base_ = static_cast<std::byte*>(base);
    segment.mapped_nbytes_ = total;
  } catch (...) {
    shm_unlink_quietly(name);
    segment.unlinked_ = true;
    throw;
  }

  auto* header = reinterpret_cast<SegmentHeader*>(segment.base_);
  header->layout_version = kSegmentLayoutVersion;
  header->kind_tag = kind_tag;
  header->header_nbytes = kSegmentHeaderBytes;
  header->payload_nbytes = payload_nbytes;
  header->total_nbytes = total;
  header->owner = self;
  header->magic = kSegmentMagic;
  header->immutable_checksum = segment_header_checksum(*header);
  header->reserved = 0;
  // release: the fields above are complete before anyone could count this attachment.
  header->attach_count.store(1, std::memory_order_release);
  segment.detached_ = false;
  return segment;
}

ShmSegment ShmSegment::attach(const std::string& name, uint32_t expected_kind) {
  const std::string full = canonical_name(name);
  const std::string context = "ShmSegment::attach(" + full + ")";
  FileDescriptor fd(::shm_open(full.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) throw_system_error("shm_open(" + full + ")");
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) throw_system_error("fstat(" + full + ")");
  TENSORXFER_CHECK(CorruptSegment, S_ISREG(info.st_mode), context, ": not a regular file");
  const auto file_nbytes = static_cast<std::size_t>(info.st_size);
  TENSORXFER_CHECK(CorruptSegment, file_nbytes >= kSegmentHeaderBytes, context, ": segment is ",
                   file_nbytes, " bytes, expected at least ", kSegmentHeaderBytes, " (truncated?)");
  SegmentHeader header{};
  TENSORXFER_CHECK(CorruptSegment, read_header(fd.get(), header), context, ": cannot read the header");
  validate_segment_header(header, file_nbytes, expected_kind, context);
  // A valid header was written after the creator took its lock: not held now means gone.
  if (!sync::liveness_held(fd.get(), kSegmentCreatorParticipant)) {
    shm_unlink_quietly(full);
    throw PeerLost(context + ": its creator (" + header.owner.describe() + ") has exited or detached");
  }

  ShmSegment segment;
  segment.name_ = full;
  segment.user_pid_ = static_cast<int32_t>(::getpid());
  segment.owner_ = header.owner;
  segment.kind_tag_ = header.kind_tag;
  segment.payload_nbytes_ = header.payload_nbytes;
  void* base = ::mmap(nullptr, file_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) throw_system_error("mmap(" + full + ")");
  segment.base_ = static_cast<std::byte*>(base);
  segment.mapped_nbytes_ = file_nbytes;
  segment.file_ = sync::ProcessLocalFd(std::move(fd));

  auto& count = reinterpret_cast<SegmentHeader*>(segment.base_)->attach_count;
  // acquire: pairs with the release of create(); a zero count means the last
  // user is tearing the segment down, so it must not be revived.
  uint32_t current = count.load(std::memory_order_acquire);
  do {
    if (current == 0) throw SystemError(context + ": segment is being removed", ENOENT);
    TENSORXFER_CHECK(CorruptSegment, current < (1u << 24), context, ": attach count ", current,
                     " is implausible");
  } while (!count.compare_exchange(current, current + 1, std::memory_order_acq_rel));
  segment.detached_ = false;
  return segment;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    detach();
    release_mapping();
    name_ = std::move(other.name_);
    file_ = std::move(other.file_);
    creator_lock_ = std::move(other.creator_lock_);
    base_ = std::exchange(other.base_, nullptr);
    mapped_nbytes_ = std::exchange(other.mapped_nbytes_, 0);
    payload_nbytes_ = std::exchange(other.payload_nbytes_, 0);
    kind_tag_ = other.kind_tag_;
    owner_ = other.owner_;
    user_pid_ = other.user_pid_;
    created_ = other.created_;
    detached_ = std::exchange(other.detached_, true);
    unlinked_ = std::exchange(other.unlinked_, true);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  detach();
  release_mapping();
}

void ShmSegment::release_mapping() noexcept {
  if (base_ != nullptr) {
    ::munmap(base_, mapped_nbytes_);
    base_ = nullptr;
    mapped_nbytes_ = 0;
  }
}

bool ShmSegment::is_creator() const noexcept { return created_ && ::getpid() == owner_.pid; }

bool ShmSegment::owner_alive() const noexcept {
  if (creator_lock_.held()) return true;  // we are the creator and have not detached
  if (!file_.valid()) return true;        // a fork()ed child's copy (or moved from): cannot tell
  try {
    return sync::liveness_held(file_.get(), kSegmentCreatorParticipant);
  } catch (...) {
    return true;  // the kernel would not say: never report an unknown as gone
  }
}

int ShmSegment::liveness_fd(const char* operation, uint32_t participant) const {
  TENSORXFER_CHECK(InvalidArgument, participant != kSegmentCreatorParticipant, "ShmSegment::", operation,
                   ": participant ", kSegmentCreatorParticipant, " is the segment's creator; use 1 and up");
  TENSORXFER_CHECK(InvalidArgument, file_.valid(), "ShmSegment::", operation, "(", name_,
                   "): this object has no file here (moved from, or a fork()ed child's copy)");
  return file_.get();
}

std::optional<sync::LivenessLock> ShmSegment::try_hold_liveness(uint32_t participant) const {
  return sync::LivenessLock::try_hold(liveness_fd("try_hold_liveness", participant), participant);
}

bool ShmSegment::participant_alive(uint32_t participant) const {
  return sync::liveness_held(liveness_fd("participant_alive", participant), participant);
}

uint32_t ShmSegment::attach_count() const noexcept {
  if (base_ == nullptr) return 0;
  // acquire: a diagnostic read; orders nothing but keeps TSan's view consistent.
  return reinterpret_cast<const SegmentHeader*>(base_)->attach_count.load(std::memory_order_acquire);
}

void ShmSegment::detach() noexcept {
  if (detached_ || base_ == nullptr) return;
  if (::getpid() != user_pid_) return;  // a fork()ed child's copy: the parent's attachment
  detached_ = true;
  auto& count = reinterpret_cast<SegmentHeader*>(base_)->attach_count;
  // acq_rel: our writes to the segment happen-before whoever sees zero and unlinks.
  const uint32_t before = count.fetch_sub(1, std::memory_order_acq_rel);
  if (before <= 1 || is_creator() || !owner_alive()) unlink();
  creator_lock_.release();  // after unlinking: nobody sweeps a name we still mean to remove
}

void ShmSegment::unlink() noexcept {
  if (unlinked_ || name_.empty()) return;
  unlinked_ = true;
  shm_unlink_quietly(name_);
}

// ---- sweeping --------------------------------------------------------------------

std::size_t sweep_stale_segments() noexcept {
  DIR* directory = ::opendir("/dev/shm");
  if (directory == nullptr) return 0;
  std::size_t removed = 0;
  const uid_t me = ::geteuid();
  const std::size_t prefix_length = std::strlen(kSegmentNamePrefix);
  while (const dirent* entry = ::readdir(directory)) {
    if (std::strncmp(entry->d_name, kSegmentNamePrefix, prefix_length) != 0) continue;
    const int raw_fd = ::openat(::dirfd(directory), entry->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (raw_fd < 0) continue;
    FileDescriptor fd(raw_fd);
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != me) continue;
    SegmentHeader header{};
    if (static_cast<std::size_t>(info.st_size) < kSegmentHeaderBytes || !read_header(fd.get(), header)) continue;
    try {
      validate_segment_header(header, static_cast<std::size_t>(info.st_size), 0, "sweep");
    } catch (...) {
      continue;  // not ours, or not a format we know: never remove it
    }
    bool creator_holds_lock = true;
    try {
      creator_holds_lock = sync::liveness_held(fd.get(), kSegmentCreatorParticipant);
    } catch (...) {
      continue;  // the kernel would not say: leave it
    }
    if (creator_holds_lock) continue;
    if (::shm_unlink(("/" + std::string(entry->d_name)).c_str()) == 0) ++removed;
  }
  ::closedir(directory);
  return removed;
}

}  // namespace tensorxfer::memory
