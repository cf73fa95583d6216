// ctest-labels: concurrent shm-sweep
#include "tensorxfer/collectives/ipc_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "collectives_test_util.h"
#include "support/process.h"
#include "tensorxfer/collectives/signal_layout.h"
#include "tensorxfer/common/error.h"

namespace tensorxfer::collectives {
namespace {

using testing::make_ipc_group;
using testing::shm_name_exists;

TEST(IpcMemoryTest, EveryRankMapsEveryRegionWithTheReferenceFields) {
  auto group = make_ipc_group(3, 8192);
  for (int rank = 0; rank < 3; ++rank) {
    const IpcMemory& memory = group[rank];
    EXPECT_EQ(memory.num_workers, 3);
    EXPECT_EQ(memory.worker_id, rank);
    EXPECT_EQ(memory.barrier_flag, 0u);
    ASSERT_EQ(memory.remote_data.size(), 3u);
    ASSERT_EQ(memory.barrier_in.size(), 3u);
    ASSERT_EQ(memory.barrier_out.size(), 3u);
    EXPECT_GE(memory.data_nbytes(), 8192u);
  }
  // Rank 1 writes its own region; ranks 0 and 2 read it through their mappings.
  std::memcpy(group[1].remote_data[1], "rank one", 9);
  EXPECT_STREQ(static_cast<const char*>(group[0].remote_data[1]), "rank one");
  EXPECT_STREQ(static_cast<const char*>(group[2].remote_data[1]), "rank one");
  // A flag written through rank 2's mapping of rank 0's barrier_in is rank 0's.
  group[2].in_lines(0)[2].epoch.store(7, std::memory_order_release);
  EXPECT_EQ(group[0].in_lines(0)[2].epoch.load(std::memory_order_acquire), 7u);
  EXPECT_NE(group[0].remote_data[0], group[1].remote_data[0]);  // different mappings, same memory
}

TEST(IpcMemoryTest, NamesAreUnlinkedOnceEveryRankMapped) {
  std::vector<IpcMemory> memories;
  std::vector<std::string> handles;
  for (int rank = 0; rank < 2; ++rank) {
    memories.push_back(IpcMemory::create_local(rank, 2, 4096, MemoryDevice::kHost));
    handles.push_back(memories.back().local_handle());
    EXPECT_EQ(handles.back().rfind("/tensorxfer-", 0), 0u) << handles.back();
  }
  for (auto& memory : memories) memory.map_peers(handles);
  EXPECT_TRUE(shm_name_exists(handles[0]));
  for (auto& memory : memories) memory.release_handles();
  EXPECT_FALSE(shm_name_exists(handles[0]));
  EXPECT_FALSE(shm_name_exists(handles[1]));
  std::memcpy(memories[0].remote_data[0], "still mapped", 13);
  EXPECT_STREQ(static_cast<const char*>(memories[1].remote_data[0]), "still mapped");
}

TEST(IpcMemoryTest, OneCallCreateRunsTheExchange) {
  std::vector<std::string> published;
  IpcMemory::Exchange exchange{[&](const std::string& mine) {
                                 published.push_back(mine);
                                 return std::vector<std::string>{mine};
                               },
                               [] {}};
  IpcMemory memory = IpcMemory::create(0, 1, 100, MemoryDevice::kHost, exchange);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_FALSE(shm_name_exists(published[0]));
  EXPECT_NE(memory.remote_data[0], nullptr);
  memory.close();
  EXPECT_TRUE(memory.is_closed());
  EXPECT_EQ(memory.remote_data[0], nullptr);
}

TEST(IpcMemoryTest, RefusesBadArguments) {
  EXPECT_THROW(IpcMemory::create_local(2, 2, 64, MemoryDevice::kHost), InvalidArgument);
  EXPECT_THROW(IpcMemory::create_local(-1, 2, 64, MemoryDevice::kHost), InvalidArgument);
  EXPECT_THROW(IpcMemory::create_local(0, 0, 64, MemoryDevice::kHost), InvalidArgument);
  EXPECT_THROW(IpcMemory::create_local(0, kMaxWorldSize + 1, 64, MemoryDevice::kHost), InvalidArgument);
  IpcMemory memory = IpcMemory::create_local(0, 2, 64, MemoryDevice::kHost);
  EXPECT_THROW(memory.map_peers({memory.local_handle()}), InvalidArgument);  // one handle for two ranks
}

#if !defined(TENSORXFER_WITH_CUDA)
TEST(IpcMemoryTest, CudaNeedsACudaBuild) {
  EXPECT_THROW(IpcMemory::create_local(0, 1, 64, MemoryDevice::kCuda), Unsupported);
}
#endif

TEST(IpcMemoryTest, DifferentSizesBetweenRanksAreRefused) {
  IpcMemory small = IpcMemory::create_local(0, 2, 4096, MemoryDevice::kHost);
  IpcMemory large = IpcMemory::create_local(1, 2, 8192, MemoryDevice::kHost);
  try {
    small.map_peers({small.local_handle(), large.local_handle()});
    FAIL() << "mapped a peer of another size";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("same nbytes"), std::string::npos) << error.what();
  }
}

// A writable mapping of a segment's first two pages (segment header, signal header).
class RawMapping {
 public:
  explicit RawMapping(const std::string& name) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return;
    void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    base_ = base == MAP_FAILED ? nullptr : static_cast<std::byte*>(base);
  }
  ~RawMapping() {
    if (base_ != nullptr) ::munmap(base_, kBytes);
  }
  RawMapping(const RawMapping&) = delete;
  RawMapping& operator=(const RawMapping&) = delete;
  SignalHeader* signal_header() const { return base_ ? reinterpret_cast<SignalHeader*>(base_ + 4096) : nullptr; }

 private:
  static constexpr std::size_t kBytes = 8192;
  std::byte* base_ = nullptr;
};

TEST(IpcMemoryTest, CorruptedHeadersAreRefusedFuzzed) {
  IpcMemory victim = IpcMemory::create_local(1, 2, 4096, MemoryDevice::kHost);
  RawMapping raw(victim.local_handle());
  SignalHeader* header = raw.signal_header();
  ASSERT_NE(header, nullptr);
  const SignalHeader good = *header;
  std::mt19937 random(12345);
  auto* bytes = reinterpret_cast<unsigned char*>(header);
  int refused = 0;
  for (int round = 0; round < 200; ++round) {
    // Flip 1-4 random bits of the checksummed bytes (and the checksum).
    const int flips = 1 + static_cast<int>(random() % 4);
    for (int i = 0; i < flips; ++i) {
      const std::size_t at = random() % (offsetof(SignalHeader, checksum) + sizeof(uint64_t));
      bytes[at] ^= static_cast<unsigned char>(1u << (random() % 8));
    }
    if (std::memcmp(header, &good, sizeof(good)) != 0) {
      IpcMemory reader = IpcMemory::create_local(0, 2, 4096, MemoryDevice::kHost);
      EXPECT_THROW(reader.map_peers({reader.local_handle(), victim.local_handle()}), CorruptSegment)
          << "round " << round;
      ++refused;
    }
    *header = good;
  }
  EXPECT_GT(refused, 150);
  // A header that claims another rank or world size is refused too.
  IpcMemory reader = IpcMemory::create_local(0, 3, 4096, MemoryDevice::kHost);
  EXPECT_THROW(reader.map_peers({reader.local_handle(), victim.local_handle(), victim.local_handle()}),
               CorruptSegment);
}

TEST(IpcMemoryTest, TruncatedSegmentIsRefused) {
  IpcMemory victim = IpcMemory::create_local(1, 2, 8192, MemoryDevice::kHost);
  const std::string name = victim.local_handle();
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096 + 512), 0);  // the segment header page and a part of the layout
  ::close(fd);
  IpcMemory reader = IpcMemory::create_local(0, 2, 8192, MemoryDevice::kHost);
  EXPECT_THROW(reader.map_peers({reader.local_handle(), name}), CorruptSegment);
}

TEST(IpcMemoryTest, PeerWhoseCreatorExitedIsReportedLost) {
  // A child creates rank 1's segment, prints nothing, and exits without unlinking
  // (_exit skips destructors); the parent, rank 0, must report it lost. (Rank 0
  // is made first: creating a segment sweeps the segments of dead creators.)
  IpcMemory reader = IpcMemory::create_local(0, 2, 4096, MemoryDevice::kHost);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = testing::fork_child([&] {
    IpcMemory memory = IpcMemory::create_local(1, 2, 4096, MemoryDevice::kHost);
    const std::string& name = memory.local_handle();
    (void)!::write(pipe_fds[1], name.data(), name.size());
    ::_exit(0);
    return 0;
  });
  ::close(pipe_fds[1]);
  char name[256] = {};
  const ssize_t got = ::read(pipe_fds[0], name, sizeof(name) - 1);
  ::close(pipe_fds[0]);
  ASSERT_EQ(testing::wait_exit_code(child), 0);
  ASSERT_GT(got, 0);
  EXPECT_THROW(reader.map_peers({reader.local_handle(), std::string(name, static_cast<std::size_t>(got))}), PeerLost);
  EXPECT_FALSE(testing::shm_name_exists(std::string(name, static_cast<std::size_t>(got))));
}

}  // namespace
}  // namespace tensorxfer::collectives
