// ctest-labels: shm-sweep
#include "tensorxfer/memory/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <regex>
#include <string>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/fd.h"

namespace tensorxfer::memory {
namespace {

using tensorxfer::testing::fork_child;
using tensorxfer::testing::fork_in_new_pid_namespace;
using tensorxfer::testing::shm_name_exists;
using tensorxfer::testing::wait_exit_code;

constexpr uint32_t kTestKind = make_kind_tag("TEST");

// Resizes the segment's file behind its back.
void truncate_file(const std::string& name, off_t nbytes) {
  FileDescriptor fd(::shm_open(name.c_str(), O_RDWR, 0));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), nbytes), 0);
}


TEST(ShmSegmentTest, AttachSeesTheCreatorsBytes) {
  ShmSegment created = ShmSegment::create(10000, kTestKind);
  ASSERT_EQ(created.payload_nbytes(), 10000u);
  std::memset(created.payload(), 0x5A, 10000);
  ShmSegment attached = ShmSegment::attach(created.name(), kTestKind);
  EXPECT_EQ(attached.payload_nbytes(), 10000u);
  EXPECT_EQ(attached.kind_tag(), kTestKind);
  EXPECT_EQ(attached.owner(), created.owner());
  EXPECT_EQ(static_cast<unsigned char>(attached.payload()[9999]), 0x5A);
  attached.payload()[0] = std::byte{7};
  EXPECT_EQ(created.payload()[0], std::byte{7});
  EXPECT_EQ(created.attach_count(), 2u);
  EXPECT_TRUE(created.is_creator());
  EXPECT_FALSE(attached.is_creator());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(created.payload()) % 4096, 0u);
}

TEST(ShmSegmentTest, NameIsUnguessableAndModeIs0600) {
  const mode_t old_umask = ::umask(0);  // a permissive umask must not widen the mode
  ShmSegment segment = ShmSegment::create(1, kTestKind);
  ::umask(old_umask);
  const std::regex pattern("/tensorxfer-" + std::to_string(::getpid()) + "-[0-9a-f]{32}");
  EXPECT_TRUE(std::regex_match(segment.name(), pattern)) << segment.name();
  ShmSegment other = ShmSegment::create(1, kTestKind);
  EXPECT_NE(segment.name(), other.name());
  struct stat info {};
  ASSERT_EQ(::stat(("/dev/shm" + segment.name()).c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  EXPECT_EQ(info.st_uid, ::geteuid());
  // The name is taken exclusively: creating it again fails.
  errno = 0;
  EXPECT_LT(::shm_open(segment.name().c_str(), O_CREAT | O_EXCL | O_RDWR, 0600), 0);
  EXPECT_EQ(errno, EEXIST);
}

TEST(ShmSegmentTest, ZeroPayloadIsAllowed) {
  ShmSegment segment = ShmSegment::create(0, kTestKind);
  ShmSegment attached = ShmSegment::attach(segment.name(), kTestKind);
  EXPECT_EQ(attached.payload_nbytes(), 0u);
}

TEST(ShmSegmentTest, AttachRefusesAnotherKind) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  try {
    (void)ShmSegment::attach(segment.name(), make_kind_tag("RING"));
    FAIL() << "attached a segment of another kind";
  } catch (const CorruptSegment& error) {
    EXPECT_NE(std::string(error.what()).find("holds 'TEST', expected 'RING'"), std::string::npos) << error.what();
  }
}

TEST(ShmSegmentTest, AttachRefusesBadNamesAndMissingSegments) {
  EXPECT_THROW((void)ShmSegment::attach("/etc/passwd", kTestKind), InvalidArgument);
  EXPECT_THROW((void)ShmSegment::attach("../tensorxfer-1", kTestKind), InvalidArgument);
  EXPECT_THROW((void)ShmSegment::attach("/tensorxfer-a/b", kTestKind), InvalidArgument);
  EXPECT_THROW((void)ShmSegment::attach("", kTestKind), InvalidArgument);
  try {
    (void)ShmSegment::attach("tensorxfer-0-doesnotexist", kTestKind);
    FAIL() << "attached a missing segment";
  } catch (const SystemError& error) {
    EXPECT_EQ(error.error_number(), ENOENT);
  }
}

TEST(ShmSegmentTest, AttachRefusesTruncatedSegments) {
  ShmSegment segment = ShmSegment::create(8192, kTestKind);
  truncate_file(segment.name(), 100);
  try {
    (void)ShmSegment::attach(segment.name(), kTestKind);
    FAIL() << "attached a truncated segment";
  } catch (const CorruptSegment& error) {
    EXPECT_NE(std::string(error.what()).find("segment is 100 bytes, expected at least 4096"), std::string::npos)
        << error.what();
  }
  truncate_file(segment.name(), 4096 + 4096);  // header intact, payload shorter than the header says
  try {
    (void)ShmSegment::attach(segment.name(), kTestKind);
    FAIL() << "attached a segment shorter than its header says";
  } catch (const CorruptSegment& error) {
    EXPECT_NE(std::string(error.what()).find("header.total_nbytes=12288"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("=8192"), std::string::npos) << error.what();
  }
}

TEST(ShmSegmentTest, AttachRefusesAModifiedHeader) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  auto* header = reinterpret_cast<SegmentHeader*>(segment.payload() - kSegmentHeaderBytes);
  header->payload_nbytes += 4096;  // what a peer lying about sizes would do
  EXPECT_THROW((void)ShmSegment::attach(segment.name(), kTestKind), CorruptSegment);
  header->payload_nbytes -= 4096;
  EXPECT_NO_THROW((void)ShmSegment::attach(segment.name(), kTestKind));
  header->magic ^= 1;
  EXPECT_THROW((void)ShmSegment::attach(segment.name(), kTestKind), CorruptSegment);
}

TEST(ShmSegmentTest, CreatorUnlinksWhileOthersStillMapTheBytes) {
  auto creator = std::make_unique<ShmSegment>(ShmSegment::create(64, kTestKind));
  const std::string name = creator->name();
  ShmSegment attached = ShmSegment::attach(name, kTestKind);
  creator->payload()[3] = std::byte{42};
  creator.reset();
  EXPECT_FALSE(shm_name_exists(name));
  EXPECT_EQ(attached.payload()[3], std::byte{42});  // still mapped
  EXPECT_EQ(attached.attach_count(), 1u);
}

TEST(ShmSegmentTest, AttachCountTracksUsersAndDetachIsIdempotent) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  ShmSegment first = ShmSegment::attach(segment.name(), kTestKind);
  {
    ShmSegment second = ShmSegment::attach(segment.name(), kTestKind);
    EXPECT_EQ(segment.attach_count(), 3u);
  }
  EXPECT_EQ(segment.attach_count(), 2u);
  first.detach();
  first.detach();
  EXPECT_TRUE(first.is_detached());
  EXPECT_TRUE(first.is_mapped());  // memory stays valid until destruction
  EXPECT_EQ(segment.attach_count(), 1u);
  EXPECT_TRUE(shm_name_exists(segment.name()));  // non-creators leave the name while the creator lives
}

TEST(ShmSegmentTest, LastUserDetachingUnlinksEvenWithoutTheCreator) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  const std::string name = segment.name();
  ShmSegment user = ShmSegment::attach(name, kTestKind);
  // Account the creator's attachment away without the creator unlinking, as
  // if it had handed its reference to `user`.
  auto* header = reinterpret_cast<SegmentHeader*>(segment.payload() - kSegmentHeaderBytes);
  header->attach_count.fetch_sub(1, std::memory_order_relaxed);
  user.detach();
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(ShmSegmentTest, AttachRefusesASegmentBeingRemoved) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  auto* header = reinterpret_cast<SegmentHeader*>(segment.payload() - kSegmentHeaderBytes);
  header->attach_count.store(0, std::memory_order_relaxed);  // the last user is detaching
  try {
    (void)ShmSegment::attach(segment.name(), kTestKind);
    FAIL() << "revived a segment whose attach count reached zero";
  } catch (const SystemError& error) {
    EXPECT_EQ(error.error_number(), ENOENT);
  }
  header->attach_count.store(1, std::memory_order_relaxed);
}

TEST(ShmSegmentTest, MovedFromSegmentDoesNothing) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  const std::string name = segment.name();
  ShmSegment moved = std::move(segment);
  segment.detach();  // NOLINT: moved-from is valid and inert
  EXPECT_TRUE(shm_name_exists(name));
  EXPECT_EQ(moved.attach_count(), 1u);
  moved = ShmSegment::create(8, kTestKind);  // move-assign releases the old one
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(ShmSegmentTest, ForkedChildCopyNeverUnlinks) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  const std::string name = segment.name();
  const pid_t child = fork_child([&] {
    EXPECT_FALSE(segment.is_creator());
    segment.detach();  // the parent's attachment: ignored here
    ShmSegment mine = ShmSegment::attach(name, kTestKind);
    mine.payload()[0] = std::byte{9};
    return 0;  // `mine` detaches normally
  });
  ASSERT_EQ(wait_exit_code(child), 0);
  EXPECT_TRUE(shm_name_exists(name));
  EXPECT_EQ(segment.attach_count(), 1u);
  EXPECT_EQ(segment.payload()[0], std::byte{9});
}

TEST(ShmSegmentTest, SurvivorUnlinksWhenTheCreatorDied) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = fork_child([&] {
    ShmSegment segment = ShmSegment::create(64, kTestKind);
    char name[128] = {};
    std::strncpy(name, segment.name().c_str(), sizeof(name) - 1);
    if (::write(pipe_fds[1], name, sizeof(name)) != sizeof(name)) return 1;
    ::pause();  // killed by the parent: no cleanup runs
    return 0;
  });
  char name[128] = {};
  ASSERT_EQ(::read(pipe_fds[0], name, sizeof(name)), static_cast<ssize_t>(sizeof(name)));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ShmSegment attached = ShmSegment::attach(name, kTestKind);
  EXPECT_TRUE(attached.owner_alive());
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_exit_code(child), 128 + SIGKILL);
  EXPECT_FALSE(attached.owner_alive());
  EXPECT_TRUE(shm_name_exists(name));
  attached.detach();
  EXPECT_FALSE(shm_name_exists(name));
}

// Returns the name of a segment created by a child that then exited without cleanup.
std::string leak_segment_from_dead_child() {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "";
  const pid_t child = fork_child([&] {
    ShmSegment segment = ShmSegment::create(64, kTestKind);
    char name[128] = {};
    std::strncpy(name, segment.name().c_str(), sizeof(name) - 1);
    if (::write(pipe_fds[1], name, sizeof(name)) != sizeof(name)) return 1;
    ::_exit(0);
  });
  char name[128] = {};
  const ssize_t got = ::read(pipe_fds[0], name, sizeof(name));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  if (wait_exit_code(child) != 0 || got != static_cast<ssize_t>(sizeof(name))) return "";
  return name;
}

TEST(ShmSegmentTest, AttachToADeadCreatorsSegmentIsPeerLostAndRemovesIt) {
  const std::string name = leak_segment_from_dead_child();
  ASSERT_FALSE(name.empty());
  ASSERT_TRUE(shm_name_exists(name));
  EXPECT_THROW((void)ShmSegment::attach(name, kTestKind), PeerLost);
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(ShmSegmentTest, SweepRemovesOnlyValidSegmentsOfDeadCreators) {
  ShmSegment live = ShmSegment::create(64, kTestKind);
  // A file with our prefix but no valid header must be left alone.
  const std::string foreign = "/tensorxfer-foreign-" + std::to_string(::getpid());
  {
    FileDescriptor fd(::shm_open(foreign.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::ftruncate(fd.get(), 8192), 0);
  }
  const std::string stale = leak_segment_from_dead_child();
  ASSERT_FALSE(stale.empty());
  const bool stale_existed = shm_name_exists(stale);
  EXPECT_GE(sweep_stale_segments(), 1u);
  const bool stale_remains = shm_name_exists(stale);
  const bool live_remains = shm_name_exists(live.name());
  const bool foreign_remains = shm_name_exists(foreign);
  ::shm_unlink(foreign.c_str());
  EXPECT_TRUE(stale_existed);
  EXPECT_FALSE(stale_remains);
  EXPECT_TRUE(live_remains);
  EXPECT_TRUE(foreign_remains);
}

TEST(ShmSegmentTest, CreateSweepsStaleSegments) {
  const std::string stale = leak_segment_from_dead_child();
  ASSERT_FALSE(stale.empty());
  ASSERT_TRUE(shm_name_exists(stale));
  ShmSegment fresh = ShmSegment::create(64, kTestKind);
  EXPECT_FALSE(shm_name_exists(stale));
}

TEST(ShmSegmentTest, LayersAboveRegisterParticipantsInTheSegment) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  ShmSegment attached = ShmSegment::attach(segment.name(), kTestKind);
  EXPECT_FALSE(segment.participant_alive(1));
  std::optional<sync::LivenessLock> one = attached.try_hold_liveness(1);
  ASSERT_TRUE(one.has_value());
  EXPECT_TRUE(segment.participant_alive(1));
  EXPECT_TRUE(attached.participant_alive(1));
  EXPECT_FALSE(segment.try_hold_liveness(1).has_value());  // taken by a live holder
  EXPECT_FALSE(segment.participant_alive(2));
  EXPECT_THROW((void)segment.try_hold_liveness(kSegmentCreatorParticipant), InvalidArgument);
  EXPECT_THROW((void)segment.participant_alive(kSegmentCreatorParticipant), InvalidArgument);
  one->release();
  EXPECT_FALSE(segment.participant_alive(1));
}

TEST(ShmSegmentTest, ACreatorThatDetachedIsGoneForTheOthers) {
  ShmSegment segment = ShmSegment::create(64, kTestKind);
  ShmSegment attached = ShmSegment::attach(segment.name(), kTestKind);
  EXPECT_TRUE(segment.owner_alive());
  EXPECT_TRUE(attached.owner_alive());
  segment.detach();
  EXPECT_FALSE(attached.owner_alive());
}

// Containers of one pod share /dev/shm but not PIDs: a creator in another PID
// namespace must stay alive to us, and its segments must survive our sweeps.
TEST(ShmSegmentTest, ACreatorInAnotherPidNamespaceIsAliveUntilKilled) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  auto child = fork_in_new_pid_namespace([&] {
    ShmSegment segment = ShmSegment::create(64, kTestKind);
    char name[128] = {};
    std::strncpy(name, segment.name().c_str(), sizeof(name) - 1);
    if (::write(pipe_fds[1], name, sizeof(name)) != sizeof(name)) return 1;
    ::pause();  // killed by the parent: no cleanup runs
    return 0;
  });
  ::close(pipe_fds[1]);
  if (!child.skip_reason.empty()) {
    ::close(pipe_fds[0]);
    GTEST_SKIP() << "needs a new PID namespace: " << child.skip_reason;
  }
  char name[128] = {};
  const ssize_t got = ::read(pipe_fds[0], name, sizeof(name));
  ::close(pipe_fds[0]);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(name)));
  EXPECT_EQ(std::string(name).rfind("/tensorxfer-1-", 0), 0u) << name << ": the creator is pid 1 in its namespace";
  (void)sweep_stale_segments();
  EXPECT_TRUE(shm_name_exists(name)) << "the sweep removed a live creator's segment";
  std::optional<ShmSegment> attached;
  EXPECT_NO_THROW(attached.emplace(ShmSegment::attach(name, kTestKind)));
  ASSERT_TRUE(attached.has_value());
  EXPECT_TRUE(attached->owner_alive());
  EXPECT_EQ(attached->owner().pid, 1);
  EXPECT_EQ(child.kill_and_wait(), 128 + SIGKILL);
  EXPECT_FALSE(attached->owner_alive());
  EXPECT_GE(sweep_stale_segments(), 1u);
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(ShmSegmentTest, KindTagNames) {
  EXPECT_EQ(kind_tag_name(make_kind_tag("RING")), "'RING'");
  EXPECT_EQ(kind_tag_name(0x01020304u), "0x01020304");
}

}  // namespace
}  // namespace tensorxfer::memory
