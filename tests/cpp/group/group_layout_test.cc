// Group segment validation: every header field checked, corrupted or
// truncated segments refused with CorruptSegment (fuzzed; run under ASan by
// scripts/sanitize.sh), claim words decoded strictly.
#include "tensorxfer/group/group_layout.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>

#include "group/group_test_util.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/group_segment.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::group {
namespace {

using namespace std::chrono_literals;
using testing::group_path;
using testing::unique_group_name;

constexpr uint64_t kMailbox = 4096;

std::size_t total_for(int world_size) { return group_segment_nbytes(world_size, kMailbox); }

TEST(GroupLayoutTest, AFreshHeaderValidates) {
  const GroupHeader header = make_group_header("job", 4, kMailbox);
  EXPECT_NO_THROW(validate_group_header(header, total_for(4), "test"));
  EXPECT_EQ(header.total_nbytes, total_for(4));
  EXPECT_EQ(mailbox_buffer_offset(4, kMailbox, 0, 0) % 64, 0u);
  EXPECT_EQ(mailbox_buffer_offset(4, kMailbox, 3, 1) + kMailboxHeaderBytes + kMailbox, total_for(4));
}

TEST(GroupLayoutTest, EachBadFieldIsNamed) {
  const GroupHeader good = make_group_header("job", 4, kMailbox);
  auto expect_refused = [&](GroupHeader header, std::size_t file_nbytes, const std::string& mentions,
                            bool fix_checksum = true) {
    if (fix_checksum) header.checksum = group_header_checksum(header);
    try {
      validate_group_header(header, file_nbytes, "test");
      ADD_FAILURE() << "expected CorruptSegment mentioning " << mentions;
    } catch (const CorruptSegment& error) {
      EXPECT_NE(std::string(error.what()).find(mentions), std::string::npos) << error.what();
    }
  };
  GroupHeader bad = good;
  bad.magic ^= 1;
  expect_refused(bad, total_for(4), "magic");
  bad = good;
  bad.layout_version = 7;
  expect_refused(bad, total_for(4), "layout_version");
  bad = good;
  bad.world_size = 5;
  expect_refused(bad, total_for(4), "checksum", /*fix_checksum=*/false);
  bad = good;
  bad.world_size = 0;
  expect_refused(bad, total_for(4), "world_size 0");
  bad = good;
  bad.world_size = kGroupMaxWorldSize + 1;
  expect_refused(bad, total_for(4), "world_size");
  bad = good;
  bad.mailbox_nbytes = 0;
  expect_refused(bad, total_for(4), "mailbox_nbytes");
  bad = good;
  bad.total_nbytes += 64;
  expect_refused(bad, total_for(4), "total_nbytes");
  expect_refused(good, total_for(4) - 1, "file_nbytes", /*fix_checksum=*/false);
  bad = good;
  bad.name_nbytes = 0;
  expect_refused(bad, total_for(4), "name_nbytes");
  bad = good;
  bad.name[10] = 'x';
  expect_refused(bad, total_for(4), "padding");
  bad = good;
  bad.reserved = 1;
  expect_refused(bad, total_for(4), "reserved");
}

TEST(GroupLayoutTest, FuzzedHeadersAreRefusedNeverTrusted) {
  const GroupHeader good = make_group_header("fuzzed-job", 3, kMailbox);
  std::mt19937_64 random(12345);
  for (int trial = 0; trial < 20000; ++trial) {
    GroupHeader header = good;
    auto* bytes = reinterpret_cast<unsigned char*>(&header);
    const int flips = 1 + static_cast<int>(random() % 4);
    bool changed = false;
    for (int i = 0; i < flips; ++i) {
      const std::size_t at = random() % sizeof(header);
      const auto mask = static_cast<unsigned char>(1 + random() % 255);
      bytes[at] ^= mask;
      changed = true;
    }
    if (std::memcmp(&header, &good, sizeof(header)) == 0 || !changed) continue;
    EXPECT_THROW(validate_group_header(header, total_for(3), "fuzz"), CorruptSegment) << "trial " << trial;
  }
  for (int trial = 0; trial < 5000; ++trial) {  // arbitrary bytes
    GroupHeader header;
    auto* bytes = reinterpret_cast<unsigned char*>(&header);
    for (std::size_t i = 0; i < sizeof(header); ++i) bytes[i] = static_cast<unsigned char>(random());
    if (trial % 2 == 0) header.magic = kGroupMagic;
    if (trial % 4 == 0) header.layout_version = kGroupLayoutVersion;
    EXPECT_THROW(validate_group_header(header, static_cast<std::size_t>(random() % (1 << 22)), "fuzz"),
                 CorruptSegment);
  }
}

TEST(GroupLayoutTest, ClaimWordsDecodeStrictly) {
  EXPECT_EQ(decode_claim(0, 0, "t").state, MemberState::kFree);
  const Claim joined = decode_claim(encode_claim(MemberState::kJoined, 1234), 0, "t");
  EXPECT_EQ(joined.state, MemberState::kJoined);
  EXPECT_EQ(joined.pid, 1234);
  EXPECT_THROW(decode_claim(uint64_t{7} << 32 | 5, 2, "t"), CorruptSegment);    // unknown state
  EXPECT_THROW(decode_claim(5, 2, "t"), CorruptSegment);                          // free with a pid
  EXPECT_THROW(decode_claim(uint64_t{2} << 32, 2, "t"), CorruptSegment);        // joined without a pid
  EXPECT_THROW(decode_claim(uint64_t{2} << 32 | 0x80000000u, 2, "t"), CorruptSegment);  // negative pid
}

// A live one-rank group whose segment file is then damaged on disk.
class DamagedSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = unique_group_name("damaged");
    group_ = LocalGroup::join(name_, 0, 1, 1s);
    path_ = group_path(name_);
  }
  void TearDown() override {
    group_->close();
    ::unlink(path_.c_str());  // a damaged segment may not unlink itself
  }
  void write_bytes(std::size_t offset, const void* data, std::size_t nbytes) {
    const int fd = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, data, nbytes, static_cast<off_t>(offset)), static_cast<ssize_t>(nbytes));
    ::close(fd);
  }
  std::string name_;
  std::string path_;
  std::unique_ptr<LocalGroup> group_;
};

TEST_F(DamagedSegmentTest, TruncatedSegmentsAreRefused) {
  struct stat info {};
  ASSERT_EQ(::stat(path_.c_str(), &info), 0);
  for (const off_t size : {off_t{0}, off_t{100}, static_cast<off_t>(kSlotsOffset), info.st_size - 1}) {
    ASSERT_EQ(::truncate(path_.c_str(), size), 0);
    EXPECT_THROW(GroupSegment::open_existing(name_), CorruptSegment) << "size " << size;
    EXPECT_THROW(LocalGroup::join(name_, 0, 1, 1s), CorruptSegment) << "size " << size;
  }
  ASSERT_EQ(::truncate(path_.c_str(), info.st_size), 0);  // so close() can write to its mapping
}

TEST_F(DamagedSegmentTest, FuzzedHeaderBytesOnDiskAreRefused) {
  std::mt19937_64 random(99);
  GroupHeader original;
  {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, &original, sizeof(original), 0), static_cast<ssize_t>(sizeof(original)));
    ::close(fd);
  }
  for (int trial = 0; trial < 300; ++trial) {
    GroupHeader damaged = original;
    auto* bytes = reinterpret_cast<unsigned char*>(&damaged);
    bytes[random() % sizeof(damaged)] ^= static_cast<unsigned char>(1 + random() % 255);
    write_bytes(0, &damaged, sizeof(damaged));
    EXPECT_THROW(GroupSegment::open_existing(name_), CorruptSegment) << "trial " << trial;
  }
  write_bytes(0, &original, sizeof(original));
  EXPECT_NO_THROW(GroupSegment::open_existing(name_));
}

TEST_F(DamagedSegmentTest, ACorruptClaimWordIsReportedNotTrusted) {
  const uint64_t bad_claim = uint64_t{9} << 32 | 77;
  write_bytes(kSlotsOffset + offsetof(RankSlot, claim), &bad_claim, sizeof(bad_claim));
  EXPECT_THROW(LocalGroup::join(name_, 0, 1, 1s), CorruptSegment);
}

}  // namespace
}  // namespace tensorxfer::group
