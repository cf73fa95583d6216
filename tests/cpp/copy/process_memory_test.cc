#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
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

TEST_F(ChildWithPattern, ReadsManyPiecesInAnyOrder) {
  // 2,000 pieces of 0 to 3 KiB (more than one call's iovecs) plus one larger than a call,
  // in a shuffled order, each to its own place in `out`.
  std::vector<RemotePiece> pieces;
  std::vector<std::pair<std::size_t, std::size_t>> where;  // (offset in the child's region, nbytes)
  std::size_t offset = 0, total = 0;
  for (std::size_t i = 0; i < 2000; ++i) {
    const std::size_t nbytes = (i * 7919) % 3072;
    where.emplace_back(offset, nbytes);
    offset += nbytes + (i % 5);
    total += nbytes;
  }
  where.emplace_back(offset, std::size_t{5} << 20);
  total += std::size_t{5} << 20;
  ASSERT_LE(offset + (std::size_t{5} << 20), kBytes);
  std::vector<std::byte> out(total);
  std::size_t placed = 0;
  for (const auto& [at, nbytes] : where) {
    pieces.push_back({reinterpret_cast<uintptr_t>(region_) + at, out.data() + placed, nbytes});
    placed += nbytes;
  }
  for (std::size_t i = 0; i + 1 < pieces.size(); ++i) std::swap(pieces[i], pieces[(i * 31) % pieces.size()]);
  CopyEngine engine(2);
  read_process_pieces(engine, child_, pieces);
  for (const RemotePiece& piece : pieces) {
    const std::size_t at = piece.remote_address - reinterpret_cast<uintptr_t>(region_);
    for (std::size_t k = 0; k < piece.nbytes; k += 97) {
      ASSERT_EQ(piece.dst[k], static_cast<std::byte>(((at + k) * 13 + 5) & 0xFF)) << at << "+" << k;
    }
    if (piece.nbytes) ASSERT_EQ(piece.dst[piece.nbytes - 1], static_cast<std::byte>(((at + piece.nbytes - 1) * 13 + 5) & 0xFF));
  }
}

TEST_F(ChildWithPattern, AnUnmappedPieceAfterReadOnesIsAnInvalidArgument) {
  // The kernel reads the first piece and stops at the second: the next call starts there and fails.
  CopyEngine engine(1);
  std::vector<std::byte> out(128);
  const std::vector<RemotePiece> pieces{{reinterpret_cast<uintptr_t>(region_), out.data(), 64},
                                        {4096, out.data() + 64, 64}};
  EXPECT_THROW(read_process_pieces(engine, child_, pieces), InvalidArgument);
  EXPECT_EQ(out[1], static_cast<std::byte>(18));
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
