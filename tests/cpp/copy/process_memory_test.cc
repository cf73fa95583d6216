#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "support/process.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/process_memory.h"

namespace tensorxfer::copy {
namespace {

// A child whose memory holds a known pattern at an address the parent also
// knows (the mapping is made before fork, so it sits at the same address).
class ChildWithPattern : public ::testing::Test {
 protected:
  static constexpr std::size_t kBytes = (std::size_t{9} << 20) + 123;  // several chunks, odd tail

  void SetUp() override {
    region_ = static_cast<std::byte*>(::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(region_, MAP_FAILED);
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    child_ = testing::fork_child([&] {
      for (std::size_t i = 0; i < kBytes; ++i) region_[i] = static_cast<std::byte>((i * 13 + 5) & 0xFF);
      char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) return 2;
      ::pause();
      return 0;
    });
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    ::close(ready[1]);
  }
  void TearDown() override {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      testing::wait_exit_code(child_);
    }
    ::munmap(region_, kBytes);
  }

  std::byte* region_ = nullptr;
  pid_t child_ = -1;
};

TEST_F(ChildWithPattern, ReadsEveryByteInParallelChunks) {
  // The parent's copy of the private mapping is still zero: the bytes must come from the child.
  CopyEngine engine(2);
  std::vector<std::byte> out(kBytes);
  read_process_memory(engine, child_, reinterpret_cast<uintptr_t>(region_), out.data(), kBytes);
  for (std::size_t i = 0; i < kBytes; i += 4097) {
    ASSERT_EQ(out[i], static_cast<std::byte>((i * 13 + 5) & 0xFF)) << i;
  }
  EXPECT_EQ(out[kBytes - 1], static_cast<std::byte>(((kBytes - 1) * 13 + 5) & 0xFF));
  const std::byte expected[4] = {std::byte{5}, std::byte{18}, std::byte{31}, std::byte{44}};
  EXPECT_TRUE(probe_process_memory(child_, reinterpret_cast<uintptr_t>(region_), expected, 4));
  const std::byte wrong[4] = {};
  EXPECT_FALSE(probe_process_memory(child_, reinterpret_cast<uintptr_t>(region_), wrong, 4));
}

TEST_F(ChildWithPattern, AnUnmappedRangeIsAnInvalidArgument) {
  CopyEngine engine(1);
  std::vector<std::byte> out(64);
  EXPECT_THROW(read_process_memory(engine, child_, 4096, out.data(), out.size()), InvalidArgument);
}

TEST_F(ChildWithPattern, AnExitedProcessIsAPeerLost) {
  ::kill(child_, SIGKILL);
  testing::wait_exit_code(child_);
  const pid_t gone = child_;
  child_ = -1;
  CopyEngine engine(1);
  std::vector<std::byte> out(64);
  EXPECT_THROW(read_process_memory(engine, gone, reinterpret_cast<uintptr_t>(region_), out.data(), out.size()),
               PeerLost);
}

TEST(ProcessMemoryTest, RefusesBadArguments) {
  CopyEngine engine(1);
  std::byte out[8];
  EXPECT_THROW(read_process_memory(engine, 0, 4096, out, 8), InvalidArgument);
  EXPECT_THROW(read_process_memory(engine, ::getpid(), UINT64_MAX - 2, out, 8), InvalidArgument);
  read_process_memory(engine, ::getpid(), 0, nullptr, 0);  // nothing to read
  EXPECT_TRUE(allow_memory_readers());
}

}  // namespace
}  // namespace tensorxfer::copy
