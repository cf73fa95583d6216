// The collectives' signal layout: a peer rank's IpcMemory header and the
// barrier words and operation descriptors it writes into this rank's lines.
//
// Two ranks of one IpcMemory live in this process; rank 1 plays the peer, and
// the input is what it leaves:
//   header mode      its SignalHeader (fields kept or replaced, checksum
//                    recomputed on request) before rank 0 maps it (map_peers,
//                    validate_signal_header);
//   descriptor mode  after both mapped, the epoch and both descriptor slots of
//                    rank 1's line in rank 0's start-barrier array, and rank 1's
//                    lost-rank word; rank 0's Communicator then runs a barrier or
//                    an all-reduce that reads them.
//
// Contract (signal_layout.h, communicator.h): mapping throws CorruptSegment /
// InvalidArgument for a header that does not describe the segment, or maps a
// region that lies inside it; a collective returns only when every rank's
// descriptor equals this rank's, and otherwise throws InvalidArgument (a
// mismatch), Timeout or PeerLost.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "fuzz_support.h"
#include "tensorxfer/collectives/communicator.h"
#include "tensorxfer/collectives/ipc_memory.h"
#include "tensorxfer/collectives/signal_layout.h"
#include "tensorxfer/memory/shm_segment.h"

namespace {

using tensorxfer::fuzz::FuzzInput;
using namespace tensorxfer::collectives;
using std::chrono::milliseconds;

template <typename T>
void maybe_replace(FuzzInput& input, uint32_t keep_mask, int bit, T& field) {
  if ((keep_mask >> bit & 1) == 0) input.take_into(&field, sizeof(field));
}

OpDescriptor take_descriptor(FuzzInput& input, const OpDescriptor& like) {
  OpDescriptor descriptor = like;
  const uint8_t change = input.take<uint8_t>();
  if ((change & 1) != 0) descriptor.kind = input.take<uint32_t>();
  if ((change & 2) != 0) descriptor.dtype = input.take<uint32_t>();
  if ((change & 4) != 0) descriptor.nbytes = input.take<uint64_t>();
  if ((change & 8) != 0) descriptor.aux = input.take<uint64_t>();
  return descriptor;
}

// Rank 1's segment mapped as its own process maps it, to write its header there.
class SegmentMapping {
 public:
  SegmentMapping(const std::string& name, std::size_t payload_nbytes)
      : nbytes_(tensorxfer::memory::kSegmentHeaderBytes + payload_nbytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return;
    void* base = ::mmap(nullptr, nbytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base != MAP_FAILED) base_ = static_cast<std::byte*>(base);
  }
  ~SegmentMapping() {
    if (base_ != nullptr) ::munmap(base_, nbytes_);
  }
  SegmentMapping(const SegmentMapping&) = delete;
  SegmentMapping& operator=(const SegmentMapping&) = delete;
  std::byte* payload() const { return base_ == nullptr ? nullptr : base_ + tensorxfer::memory::kSegmentHeaderBytes; }

 private:
  std::size_t nbytes_;
  std::byte* base_ = nullptr;
};

void header_mode(FuzzInput& input, IpcMemory& rank0, IpcMemory& rank1) {
  const SignalLayout layout = SignalLayout::compute(2, rank1.data_nbytes());
  SegmentMapping peer(rank1.local_handle(), layout.total_nbytes);
  if (peer.payload() == nullptr) return;
  SignalHeader header;
  std::memcpy(&header, peer.payload(), sizeof(header));
  const uint32_t keep = input.take<uint32_t>();
  maybe_replace(input, keep, 0, header.magic);
  maybe_replace(input, keep, 1, header.layout_version);
  maybe_replace(input, keep, 2, header.world_size);
  maybe_replace(input, keep, 3, header.rank);
  maybe_replace(input, keep, 4, header.reserved);
  maybe_replace(input, keep, 5, header.data_offset);
  maybe_replace(input, keep, 6, header.data_nbytes);
  maybe_replace(input, keep, 7, header.padding);
  maybe_replace(input, keep, 8, header.checksum);
  if ((keep >> 9 & 1) == 0) header.checksum = signal_header_checksum(header);
  std::memcpy(peer.payload(), &header, sizeof(header));

  if (!tensorxfer::fuzz::accepted("IpcMemory::map_peers", [&] { rank0.map_peers({rank0.local_handle(), rank1.local_handle()}); })) {
    return;
  }
  // Accepted: rank 1's whole data region is mapped in rank 0, where its own header says.
  TENSORXFER_FUZZ_EXPECT(rank0.is_mapped(), "map_peers returned without mapping");
  TENSORXFER_FUZZ_EXPECT(header.data_offset == layout.data_offset && header.data_nbytes == rank0.data_nbytes(),
                         "map_peers accepted data_offset ", header.data_offset, " and data_nbytes ",
                         header.data_nbytes, " for a layout at ", layout.data_offset, " of ", rank0.data_nbytes());
  if (rank0.data_nbytes() != 0) {
    volatile std::byte* last = rank0.data(1) + rank0.data_nbytes() - 1;
    *last = *last;
  }
}

void descriptor_mode(FuzzInput& input, IpcMemory rank0, IpcMemory& rank1, std::size_t max_bytes) {
  if (!tensorxfer::fuzz::accepted("map_peers", [&] { rank0.map_peers({rank0.local_handle(), rank1.local_handle()}); }) ||
      !tensorxfer::fuzz::accepted("map_peers", [&] { rank1.map_peers({rank0.local_handle(), rank1.local_handle()}); })) {
    return;
  }
  std::optional<Communicator> communicator;
  if (!tensorxfer::fuzz::accepted("Communicator", [&] {
        communicator.emplace(std::move(rank0), max_bytes, max_bytes, std::function<void()>{}, std::chrono::nanoseconds(0));
      })) {
    return;
  }
  IpcMemory& memory = communicator->memory();
  const uint8_t call = input.take<uint8_t>();
  // Rank 1's line in rank 0's start-barrier array: its epoch and its operation (sequence 0 uses
  // slot 0). A peer that means well writes rank 0's own call; the input changes fields of it.
  const OpDescriptor barrier_call{5, 0, 0, 0};  // Collective::kBarrier (communicator_internal.h)
  const OpDescriptor all_reduce_call{1, (2u << 16) | (32u << 8) | 1u, 16, 0};  // all_reduce(SUM, float32, 4)
  const OpDescriptor& like = (call & 1) != 0 ? all_reduce_call : barrier_call;
  FlagLine& line = memory.in_lines(0)[1];
  line.descriptor[0] = take_descriptor(input, like);
  line.descriptor[1] = take_descriptor(input, like);
  const uint8_t epoch = input.take<uint8_t>();
  line.epoch.store(epoch < 0xF0 ? epoch % 3 : input.take<uint64_t>(), std::memory_order_release);
  if ((call & 2) != 0) rank1.wake_line(1).lost_rank.store(input.take<uint32_t>(), std::memory_order_release);
  const OpDescriptor theirs = line.descriptor[0];

  bool ok = false;
  float values[4] = {1, 2, 3, 4};
  if ((call & 1) != 0) {
    tensorxfer::TensorView view;
    view.data = values;
    view.dtype = DLDataType{kDLFloat, 32, 1};
    view.shape = {4};
    view.strides = {1};
    ok = tensorxfer::fuzz::accepted("all_reduce", [&] {
      communicator->all_reduce(view, ReduceOp::kSum, Algorithm::kOneShot, milliseconds(1));
    });
  } else {
    ok = tensorxfer::fuzz::accepted("barrier", [&] { communicator->barrier(milliseconds(1)); });
  }
  // A lost rank rank 0 passes on to its peers is a rank of the group (never a peer's garbage).
  const uint32_t passed_on = memory.wake_line(0).lost_rank.load(std::memory_order_acquire);
  TENSORXFER_FUZZ_EXPECT(passed_on <= 2, "rank 0 told its peers that rank ", passed_on, " - 1 was lost");
  // What rank 0 described, as it wrote it into rank 1's array.
  const OpDescriptor mine = rank1.in_lines(1)[0].descriptor[0];
  TENSORXFER_FUZZ_EXPECT(!ok || theirs == mine, "a collective completed although rank 1 described another "
                         "operation (kind ", theirs.kind, ", dtype ", theirs.dtype, ", nbytes ", theirs.nbytes, ")");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput input(data, size);
  const uint8_t mode = input.take<uint8_t>();
  const std::size_t max_bytes = 4096;
  const std::size_t data_nbytes =
      (mode & 1) == 0 ? input.take_in<std::size_t>(0, 3 * 4096) : Communicator::required_data_nbytes(max_bytes, max_bytes, 2);
  std::optional<IpcMemory> rank0, rank1;
  if (!tensorxfer::fuzz::accepted("IpcMemory::create_local", [&] {
        rank0.emplace(IpcMemory::create_local(0, 2, data_nbytes, MemoryDevice::kHost));
        rank1.emplace(IpcMemory::create_local(1, 2, data_nbytes, MemoryDevice::kHost));
      })) {
    return 0;
  }
  if ((mode & 1) == 0) {
    header_mode(input, *rank0, *rank1);
  } else {
    descriptor_mode(input, std::move(*rank0), *rank1, max_bytes);
  }
  return 0;
}
