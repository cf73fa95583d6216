// IpcMemory: construction steps, the host backing (one shared segment per rank).
#include "tensorxfer/collectives/ipc_memory.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "ipc_memory_backing.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/memory/shm_segment.h"

namespace tensorxfer::collectives {
namespace {

constexpr uint32_t kCollectiveSegmentKind = memory::make_kind_tag("COLL");

class HostBacking final : public IpcMemory::Backing {
 public:
  HostBacking(const SignalLayout& layout, int rank)
      : layout_(layout), rank_(rank), own_(memory::ShmSegment::create(layout.total_nbytes, kCollectiveSegmentKind)) {
    // The segment is zeroed: every flag reads epoch 0 ("never arrived"), the EventCount is idle.
    const SignalHeader header = make_signal_header(layout, rank);
    std::memcpy(own_.payload(), &header, sizeof(header));
    peers_.resize(static_cast<std::size_t>(layout.world_size));
  }

  MemoryDevice device() const noexcept override { return MemoryDevice::kHost; }
  const std::string& local_handle() const noexcept override { return own_.name(); }
  std::byte* local_base() const noexcept override { return own_.payload(); }

  std::byte* map_peer(int rank, const std::string& handle) override {
    const std::string context = detail::concat("IpcMemory: rank ", rank_, " mapping rank ", rank, "'s segment '",
                                               handle, "'");
    memory::ShmSegment segment = [&] {
      try {
        return memory::ShmSegment::attach(handle, kCollectiveSegmentKind);
      } catch (const PeerLost& error) {
        throw PeerLost(detail::concat(context, ": rank ", rank, " has exited (", error.what(), ")"));
      }
    }();
    SignalHeader header;
    std::memcpy(&header, segment.payload(), sizeof(header));
    validate_signal_header(header, segment.payload_nbytes(), rank, layout_.world_size, context);
    if (header.data_nbytes != layout_.data_nbytes) {
      throw InvalidArgument(detail::concat(context, ": every rank must ask for the same nbytes; this rank asked for ",
                                           layout_.data_nbytes, ", rank ", rank, " for ", header.data_nbytes));
    }
    std::byte* base = segment.payload();
    peers_[static_cast<std::size_t>(rank)].emplace(std::move(segment));
    return base;
  }

  void release_handles() noexcept override { own_.unlink(); }

  bool peer_alive(int rank) const noexcept override {
    const auto& peer = peers_[static_cast<std::size_t>(rank)];
    return !peer || peer->owner_alive();
  }

  void check_peers_alive() const override {
    for (std::size_t rank = 0; rank < peers_.size(); ++rank) {
      const auto& peer = peers_[rank];
      if (peer && !peer->owner_alive()) {
        throw PeerLost(detail::concat("IpcMemory: rank ", rank, " (", peer->owner().describe(),
                                      ") has exited or closed its IpcMemory; rank ", rank_,
                                      " cannot complete the collective"));
      }
    }
  }

  // Detaches but keeps the mappings until destruction: views handed out
  // earlier (numpy arrays in Python) stay valid.
  void close() noexcept override {
    for (auto& peer : peers_) {
      if (peer) peer->detach();
    }
    own_.unlink();
    own_.detach();
  }

 private:
  SignalLayout layout_;
  int rank_;
  memory::ShmSegment own_;
  std::vector<std::optional<memory::ShmSegment>> peers_;  // own rank: empty
};

}  // namespace

std::unique_ptr<IpcMemory::Backing> make_host_backing(const SignalLayout& layout, int rank) {
  return std::make_unique<HostBacking>(layout, rank);
}

IpcMemory IpcMemory::create(int rank, int world_size, std::size_t data_nbytes, MemoryDevice device,
                            const Exchange& exchange) {
  TENSORXFER_CHECK(InvalidArgument, exchange.all_gather && exchange.barrier,
                   "IpcMemory::create: the exchange needs both all_gather and barrier");
  IpcMemory memory = create_local(rank, world_size, data_nbytes, device);
  const std::vector<std::string> handles = exchange.all_gather(memory.local_handle());
  memory.map_peers(handles);
  exchange.barrier();  // everyone has mapped everyone: the names are no longer needed
  memory.release_handles();
  return memory;
}

void IpcMemory::check_rank_arguments(int rank, int world_size) const {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1 && world_size <= kMaxWorldSize,
                   "IpcMemory: world_size must be in [1, ", kMaxWorldSize, "], got ", world_size);
  TENSORXFER_CHECK(InvalidArgument, rank >= 0 && rank < world_size, "IpcMemory: rank must be in [0, ", world_size,
                   "), got ", rank);
}

IpcMemory IpcMemory::create_local(int rank, int world_size, std::size_t data_nbytes, MemoryDevice device,
                                  int cuda_device) {
  IpcMemory memory;
  memory.check_rank_arguments(rank, world_size);
  const SignalLayout layout = SignalLayout::compute(world_size, data_nbytes);
  memory.backing_ = device == MemoryDevice::kHost ? make_host_backing(layout, rank)
                                                  : make_cuda_backing(layout, rank, cuda_device);
  memory.data_nbytes_ = data_nbytes;
  memory.num_workers = world_size;
  memory.worker_id = rank;
  memory.remote_data.assign(static_cast<std::size_t>(world_size), nullptr);
  memory.barrier_in.assign(static_cast<std::size_t>(world_size), nullptr);
  memory.barrier_out.assign(static_cast<std::size_t>(world_size), nullptr);
  memory.wake_.assign(static_cast<std::size_t>(world_size), nullptr);
  return memory;
}

const std::string& IpcMemory::local_handle() const {
  TENSORXFER_CHECK(Closed, backing_ != nullptr, "IpcMemory is closed");
  return backing_->local_handle();
}

void IpcMemory::map_peers(const std::vector<std::string>& handles) {
  TENSORXFER_CHECK(Closed, backing_ != nullptr, "IpcMemory::map_peers: IpcMemory is closed");
  TENSORXFER_CHECK(InvalidArgument, !is_mapped(), "IpcMemory::map_peers: already mapped");
  TENSORXFER_CHECK_EQ(InvalidArgument, "IpcMemory::map_peers: one handle per rank", handles.size(),
                      static_cast<std::size_t>(num_workers));
  const SignalLayout layout = SignalLayout::compute(num_workers, data_nbytes());
  for (int rank = 0; rank < num_workers; ++rank) {
    std::byte* base = rank == worker_id ? backing_->local_base()
                                        : backing_->map_peer(rank, handles[static_cast<std::size_t>(rank)]);
    const auto index = static_cast<std::size_t>(rank);
    remote_data[index] = base + layout.data_offset;
    barrier_in[index] = base + layout.barrier_in_offset;
    barrier_out[index] = base + layout.barrier_out_offset;
    wake_[index] = reinterpret_cast<WakeLine*>(base + layout.wake_offset);
  }
}

void IpcMemory::release_handles() noexcept {
  if (backing_) backing_->release_handles();
}

IpcMemory::IpcMemory(IpcMemory&& other) noexcept = default;
IpcMemory& IpcMemory::operator=(IpcMemory&& other) noexcept {
  if (this != &other) {
    close();
    num_workers = other.num_workers;
    worker_id = other.worker_id;
    remote_data = std::move(other.remote_data);
    barrier_in = std::move(other.barrier_in);
    barrier_out = std::move(other.barrier_out);
    barrier_flag = other.barrier_flag;
    backing_ = std::move(other.backing_);
    retired_ = std::move(other.retired_);
    wake_ = std::move(other.wake_);
    data_nbytes_ = other.data_nbytes_;
  }
  return *this;
}

IpcMemory::~IpcMemory() {
  close();
  retired_.reset();
}

MemoryDevice IpcMemory::device() const noexcept { return backing_ ? backing_->device() : MemoryDevice::kHost; }

std::size_t IpcMemory::data_nbytes() const noexcept { return backing_ ? data_nbytes_ : 0; }

bool IpcMemory::is_mapped() const noexcept {
  return backing_ != nullptr && !remote_data.empty() && remote_data.back() != nullptr;
}

bool IpcMemory::is_closed() const noexcept { return backing_ == nullptr; }


bool IpcMemory::peer_alive(int rank) const noexcept {
  return backing_ == nullptr || rank < 0 || rank >= num_workers || backing_->peer_alive(rank);
}

void IpcMemory::check_peers_alive() const {
  TENSORXFER_CHECK(Closed, backing_ != nullptr, "IpcMemory is closed");
  backing_->check_peers_alive();
}

void IpcMemory::close_peer_mappings() noexcept {
  if (!backing_ || backing_->device() != MemoryDevice::kCuda) return;
  backing_->close_peer_mappings();
  for (int rank = 0; rank < num_workers; ++rank) {
    if (rank == worker_id) continue;
    const auto index = static_cast<std::size_t>(rank);
    remote_data[index] = barrier_in[index] = barrier_out[index] = nullptr;
    wake_[index] = nullptr;
  }
}

void IpcMemory::close() noexcept {
  if (!backing_) return;
  backing_->close();
  retired_ = std::move(backing_);
  std::fill(remote_data.begin(), remote_data.end(), nullptr);
  std::fill(barrier_in.begin(), barrier_in.end(), nullptr);
  std::fill(barrier_out.begin(), barrier_out.end(), nullptr);
  std::fill(wake_.begin(), wake_.end(), nullptr);
}

}  // namespace tensorxfer::collectives
