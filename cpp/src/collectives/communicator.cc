// Communicator: the collectives' chunk loops over the signal barrier.
#include "tensorxfer/collectives/communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/streaming_copy.h"

namespace tensorxfer::collectives {
namespace {

constexpr std::size_t kPage = 4096;

// In-buffer all-reduces of at least this many bytes gather the peers' slices
// with streaming stores: the caller reads the result long after, and skipping
// the read-for-ownership of every line pays once the buffer is far from the
// caches (bench_collectives.py, 2 ranks on a 2-core Xeon, result gathered
// after other work: 64 MiB 10.4 -> 9.0 ms; 16 MiB unchanged; the staged path,
// whose gather goes in 128 KiB slices, measured slower with it).
constexpr std::size_t kStreamingGatherBytes = std::size_t{32} << 20;

// memcpy that accepts empty tensors (whose data pointer may be null).
inline void copy_bytes(void* destination, const void* source, std::size_t nbytes) noexcept {
  if (nbytes != 0) std::memcpy(destination, source, nbytes);
}

std::size_t round_up_page(std::size_t value) {
  TENSORXFER_CHECK(InvalidArgument, value <= std::numeric_limits<std::size_t>::max() - kPage,
                   "Communicator: size ", value, " overflows");
  return (value + kPage - 1) / kPage * kPage;
}

// Descriptor kinds: collective in the low byte, then reduce op, then algorithm.
enum class Collective : uint32_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast, kBarrier };
const char* collective_name(uint32_t kind) {
  switch (static_cast<Collective>(kind & 0xff)) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}
uint32_t encode_kind(Collective collective, uint32_t op = 0, uint32_t algorithm = 0) {
  return static_cast<uint32_t>(collective) | op << 8 | algorithm << 16;
}
uint32_t encode_dtype(DLDataType dtype) {
  return static_cast<uint32_t>(dtype.code) << 16 | static_cast<uint32_t>(dtype.bits) << 8 | dtype.lanes;
}
std::string describe(const OpDescriptor& d) {
  return detail::concat(collective_name(d.kind), "(kind=0x", std::hex, d.kind, std::dec, ", dtype=0x", std::hex,
                        d.dtype, std::dec, ", nbytes=", d.nbytes, ", aux=", d.aux, ")");
}

std::string seconds_text(std::chrono::nanoseconds timeout) {
  std::ostringstream text;
  text << std::chrono::duration<double>(timeout).count() << " s";
  return text.str();
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream text;
  for (std::size_t i = 0; i < ranks.size(); ++i) text << (i ? ", " : "") << ranks[i];
  return text.str();
}

void require_tensor(const TensorView& view, const char* argument) {
  require_contiguous_host(view, argument);
  require_writable(view, argument);
}

// Element slice [begin, end) of `count` that rank `rank` owns in a two-shot
// step; boundaries on 64-byte multiples so each rank's slice starts on its own line.
std::pair<std::size_t, std::size_t> slice_of(int rank, int world, std::size_t count, std::size_t element) {
  const std::size_t align = std::max<std::size_t>(1, 64 / element);
  auto boundary = [&](int r) {
    if (r >= world) return count;
    const std::size_t raw = static_cast<std::size_t>((static_cast<unsigned __int128>(count) * r) / world);
    return std::min(count, raw / align * align);
  };
  return {boundary(rank), boundary(rank + 1)};
}

}  // namespace

Algorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return Algorithm::kAuto;
  if (name == "one_shot") return Algorithm::kOneShot;
  if (name == "two_shot") return Algorithm::kTwoShot;
  throw InvalidArgument("algorithm must be one of 'auto', 'one_shot', 'two_shot', got '" + name + "'");
}

const char* algorithm_name(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kOneShot: return "one_shot";
    case Algorithm::kTwoShot: return "two_shot";
  }
  return "?";
}

Algorithm choose_algorithm(std::size_t nbytes, int world_size) noexcept {
  // One-shot reads world_size inputs per element on every rank; two-shot
  // reads them once per element overall but pays a second barrier and a copy.
  // Below the crossover the barrier dominates.
  // Measured (bench_collectives.py, 2 ranks): two-shot already wins at 64 KiB
  // (11 vs 15 us), one-shot at 1 KiB (one barrier instead of two).
  if (world_size <= 2) return nbytes <= (std::size_t{16} << 10) ? Algorithm::kOneShot : Algorithm::kTwoShot;
  return nbytes <= (std::size_t{8} << 10) ? Algorithm::kOneShot : Algorithm::kTwoShot;
}

// ---- one call --------------------------------------------------------------------

struct Communicator::Call {
  Call(Communicator& owner, const char* operation, std::chrono::nanoseconds timeout, const sync::WaitHook& hook)
      : owner(owner), operation(operation), timeout(timeout), hook(hook) {
    TENSORXFER_CHECK(InvalidArgument, timeout.count() >= 0, operation, ": timeout must be >= 0, got ",
                     timeout.count(), " ns");
    const auto now = sync::WaitClock::now();
    deadline = timeout >= std::chrono::duration_cast<std::chrono::nanoseconds>(sync::WaitTime::max() - now)
                   ? sync::WaitTime::max()
                   : now + std::chrono::duration_cast<sync::WaitClock::duration>(timeout);
  }

  // Waits for `lines` at `epoch`; a timeout names the missing ranks.
  void wait(BarrierLines lines, uint64_t epoch, const char* stage) {
    const std::function<void()> watch = [this, lines, epoch] {
      try {
        if (hook) hook();
      } catch (const PeerLost&) {  // the group's liveness check, in the hook
        if (!owner.barrier_.arrived(lines, epoch)) throw;
      }
      owner.watch_peers(lines, epoch);
    };
    if (owner.barrier_.wait(lines, epoch, deadline, watch) == sync::WaitStatus::kReady) return;
    throw Timeout(detail::concat(operation, ": rank ", owner.rank(), " waited ", seconds_text(timeout), " at the ",
                                 stage, " barrier; ranks not arrived: ",
                                 ranks_text(owner.barrier_.missing(lines, epoch))));
  }

  Communicator& owner;
  const char* operation;
  std::chrono::nanoseconds timeout;
  const sync::WaitHook& hook;
  sync::WaitTime deadline;
};

// ---- construction -------------------------------------------------------------

std::size_t Communicator::stage_nbytes_for(std::size_t max_bytes, int world_size) {
  TENSORXFER_CHECK(InvalidArgument, world_size >= 1 && world_size <= kMaxWorldSize,
                   "Communicator: world_size must be in [1, ", kMaxWorldSize, "], got ", world_size);
  // reduce_scatter puts one element per rank into a window at the least.
  const std::size_t one_element_per_rank = static_cast<std::size_t>(world_size) * kMaxElementBytes;
  return round_up_page(std::max({max_bytes, kMinStageBytes, one_element_per_rank}));
}

std::size_t Communicator::required_data_nbytes(std::size_t max_bytes, std::size_t buffer_bytes, int world_size) {
  const std::size_t stage = stage_nbytes_for(max_bytes, world_size);
  const std::size_t buffer = round_up_page(buffer_bytes);
  TENSORXFER_CHECK(InvalidArgument, stage <= (std::numeric_limits<std::size_t>::max() - buffer) / 2,
                   "Communicator: max_bytes ", max_bytes, " and buffer_bytes ", buffer_bytes, " overflow");
  return 2 * stage + buffer;
}

Communicator::Communicator(IpcMemory memory, std::size_t max_bytes, std::size_t buffer_bytes,
                           std::function<void()> peer_check, std::chrono::nanoseconds spin_budget)
    : memory_(std::move(memory)),
      stage_nbytes_(stage_nbytes_for(max_bytes, memory_.num_workers)),
      owner_pid_(::getpid()),
      buffer_nbytes_(buffer_bytes),
      peer_check_(std::move(peer_check)),
      barrier_(memory_, [&] {
        if (spin_budget.count() >= 0) return spin_budget;
        // Ranks that fit the cores spin long enough to cover a peer's copy of a
        // chunk; more ranks than cores spin briefly (yielding) and then sleep,
        // so the rank being waited for gets the CPU.
        const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
        return std::chrono::nanoseconds(static_cast<unsigned>(memory_.num_workers) <= cpus ? 200'000 : 20'000);
      }()) {
  TENSORXFER_CHECK(Unsupported, memory_.device() == MemoryDevice::kHost,
                   "Communicator: collectives on CUDA IpcMemory need device kernels, which this build does not have");
  TENSORXFER_CHECK(InvalidArgument, memory_.is_mapped(), "Communicator: the IpcMemory must be mapped (map_peers)");
  TENSORXFER_CHECK_LE(InvalidArgument, "Communicator: IpcMemory too small", required_data_nbytes(max_bytes, buffer_bytes, memory_.num_workers),
                      memory_.data_nbytes());
  sources_.resize(static_cast<std::size_t>(memory_.num_workers));
}

std::byte* Communicator::window(int rank, uint64_t sequence) const noexcept {
  return memory_.data(rank) + (sequence % 2) * stage_nbytes_;
}

std::byte* Communicator::buffer(int rank) const noexcept {
  return memory_.is_closed() ? nullptr : memory_.data(rank) + 2 * stage_nbytes_;
}

void Communicator::require_outside_windows(const TensorView& view, const char* argument) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(view.data);
  const std::uintptr_t end = begin + view.nbytes();
  for (int r = 0; r < world_size(); ++r) {
    const auto windows = reinterpret_cast<std::uintptr_t>(memory_.data(r));
    const std::uintptr_t windows_end = windows + 2 * stage_nbytes_;
    TENSORXFER_CHECK(InvalidArgument, view.nbytes() == 0 || end <= windows || begin >= windows_end, argument,
                     " overlaps rank ", r, "'s staging windows (bytes [", begin - std::min(begin, windows), ", ",
                     std::min(end, windows_end) - windows, ") of its region), which the communicator itself writes; "
                     "only Communicator.buffer() is zero-copy input, other tensors must lie outside its IpcMemory");
  }
}

void Communicator::watch_peers(BarrierLines lines, uint64_t epoch) {
  if (closing_.load(std::memory_order_acquire)) throw Closed("Communicator is closed");
  int lost = -1;
  try {
    check_peers(lost);
  } catch (const PeerLost&) {
    // A peer that arrived and then closed or exited is not lost for this
    // wait: what it wrote before arriving is visible, so the wait is over.
    if (barrier_.arrived(lines, epoch)) return;
    if (lost >= 0) record_lost_rank(lost);
    throw;
  }
}

void Communicator::check_peers(int& lost) {
  const int me = rank();
  // A peer that gave up because some rank died names that rank; say so
  // before looking at liveness (the peer may have closed since).
  for (int r = 0; r < world_size(); ++r) {
    if (r == me) continue;
    // acquire: pairs with the release in record_lost_rank.
    const uint32_t lost_word = memory_.wake_line(r).lost_rank.load(std::memory_order_acquire);
    if (lost_word != 0) {
      lost = static_cast<int>(lost_word) - 1;
      throw PeerLost(detail::concat("Communicator: rank ", lost, " was lost (rank ", r,
                                    " noticed and gave up); rank ", me, " cannot complete the collective"));
    }
  }
  try {
    memory_.check_peers_alive();
  } catch (const PeerLost&) {
    for (int q = 0; q < world_size(); ++q) {  // which one, to tell the others
      if (q != me && !memory_.peer_alive(q)) {
        lost = q;
        break;
      }
    }
    throw;
  }
  if (peer_check_) peer_check_();
}

void Communicator::record_lost_rank(int lost) noexcept {
  auto& word = memory_.wake_line(rank()).lost_rank;
  uint32_t expected = 0;
  // release: peers that read it (acquire) see a rank number written once.
  (void)word.compare_exchange(expected, static_cast<uint32_t>(lost + 1), std::memory_order_release);
}

void Communicator::check_usable(const char* operation) const {
  TENSORXFER_CHECK(Closed, !memory_.is_closed() && !closing_.load(std::memory_order_acquire), operation,
                   ": Communicator is closed");
  TENSORXFER_CHECK(InvalidArgument, broken_reason_.empty(), operation,
                   ": the communicator is unusable after an earlier failure (", broken_reason_,
                   "); make a new one");
}

void Communicator::close() noexcept {
  if (::getpid() != owner_pid_) {
    // A fork()ed child: the parent's threads (and any lock they held) do not
    // exist here; nothing runs in this copy, so release it without the lock.
    memory_.close();
    return;
  }
  // One close() at a time (only close() changes the memory's pointers, so
  // the wake-ups below read them safely while an operation runs).
  std::lock_guard<std::mutex> closer(close_mutex_);
  // A running operation sees closing_ within one watch slice and ends with
  // Closed, so the lock below is not held for long.
  closing_.store(true, std::memory_order_release);
  for (int r = 0; r < world_size() && !memory_.is_closed(); ++r) memory_.wake(r).notify_all();
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.close();
}

// ---- barriers ------------------------------------------------------------------

uint64_t Communicator::start_barrier(Call& call, const OpDescriptor& descriptor) {
  const uint64_t sequence = sequence_;
  const uint64_t epoch = ++memory_.barrier_flag;
  barrier_.arrive(BarrierLines::kIn, epoch, &descriptor, sequence);
  call.wait(BarrierLines::kIn, epoch, "start");
  ++sequence_;
  for (int rank = 0; rank < world_size(); ++rank) {
    const OpDescriptor& theirs = barrier_.descriptor_of(rank, sequence);
    if (!(theirs == descriptor)) {
      throw InvalidArgument(detail::concat(call.operation, ": ranks called different operations: rank ", this->rank(),
                                           " called ", describe(descriptor), ", rank ", rank, " called ",
                                           describe(theirs), " (every rank must make the same calls with the same "
                                           "sizes, dtypes and options)"));
    }
  }
  return sequence;
}

void Communicator::out_barrier(Call& call, const char* stage) {
  const uint64_t epoch = ++memory_.barrier_flag;
  barrier_.arrive(BarrierLines::kOut, epoch, nullptr, 0);
  call.wait(BarrierLines::kOut, epoch, stage);
}

template <typename Check, typename Body>
void Communicator::run_operation(const char* operation, Check&& check, Body&& body) {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  TENSORXFER_CHECK(InvalidArgument, lock.owns_lock(), operation, ": one operation at a time: another thread is ",
                   "running a collective on this Communicator (or closing it)");
  check_usable(operation);
  check();  // refuses before anything moves: the communicator stays usable
  try {
    body();
  } catch (const std::exception& error) {
    if (broken_reason_.empty()) broken_reason_ = error.what();
    throw;
  }
}

// ---- all_reduce --------------------------------------------------------------------

void Communicator::all_reduce(const TensorView& tensor, ReduceOp op, Algorithm algorithm,
                              std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  require_tensor(tensor, "all_reduce: tensor");
  const ElementType type = element_type_of(tensor.dtype, "all_reduce: tensor");
  const std::size_t element = element_size(type);
  const std::size_t count = static_cast<std::size_t>(tensor.numel());
  const std::size_t nbytes = count * element;
  Call call(*this, "all_reduce", timeout, hook);
  run_operation("all_reduce", [&] { require_outside_windows(tensor, "all_reduce: tensor"); }, [&] {
    auto* data = static_cast<std::byte*>(tensor.data);
    if (algorithm == Algorithm::kAuto) algorithm = choose_algorithm(nbytes, world_size());
    // A tensor in the zero-copy buffer skips the copy in, which pays for
    // two-shot messages of more than one chunk; smaller ones (and one-shot) are
    // copied through a window like any tensor, which saves the end barrier the
    // buffer needs (measured: 2 ranks, 64 KiB: 9 us staged, 15 us in place).
    std::byte* own_buffer = buffer(rank());
    const bool in_buffer = algorithm == Algorithm::kTwoShot && nbytes > stage_nbytes_ && data >= own_buffer &&
                           data + nbytes <= own_buffer + buffer_nbytes_;
    const uint64_t offset = in_buffer ? static_cast<uint64_t>(data - own_buffer) : 0;
    const OpDescriptor descriptor{encode_kind(Collective::kAllReduce, static_cast<uint32_t>(op),
                                              static_cast<uint32_t>(algorithm)),
                                  encode_dtype(tensor.dtype), nbytes, in_buffer ? offset + 1 : 0};
    if (in_buffer) {
      all_reduce_in_buffer(call, offset, count, type, op, descriptor);
    } else {
      all_reduce_staged(call, data, count, type, op, algorithm, descriptor);
    }
  });
}

void Communicator::all_reduce_staged(Call& call, std::byte* data, std::size_t count, ElementType type, ReduceOp op,
                                     Algorithm algorithm, const OpDescriptor& descriptor) {
  const std::size_t element = element_size(type);
  const std::size_t chunk_count = stage_nbytes_ / element;
  const int world = world_size();
  const int me = rank();
  std::size_t done = 0;
  do {  // at least once: a zero-element call still meets the other ranks
    const std::size_t n = std::min(chunk_count, count - done);
    std::byte* chunk = data + done * element;
    std::byte* mine = window(me, sequence_);
    if (algorithm == Algorithm::kOneShot) {
      copy_bytes(mine, chunk, n * element);
      const uint64_t sequence = start_barrier(call, descriptor);
      for (int r = 0; r < world; ++r) sources_[r] = window(r, sequence);
      reduce_elements(type, op, sources_.data(), world, world, chunk, nullptr, n);
    } else {
      // Peer q reads only slice q of my window: my own slice stays in the
      // caller's tensor, which I reduce from directly.
      const auto [begin, end] = slice_of(me, world, n, element);
      copy_bytes(mine, chunk, begin * element);
      copy_bytes(mine + end * element, chunk + end * element, (n - end) * element);
      const uint64_t sequence = start_barrier(call, descriptor);
      for (int r = 0; r < world; ++r) {
        sources_[r] = (r == me ? chunk : window(r, sequence)) + begin * element;
      }
      // Into the result and into my window, where peers gather it from.
      reduce_elements(type, op, sources_.data(), world, world, chunk + begin * element, mine + begin * element,
                      end - begin);
      out_barrier(call, "middle");
      for (int r = 0; r < world; ++r) {
        if (r == me) continue;
        const auto [from, to] = slice_of(r, world, n, element);
        copy_bytes(chunk + from * element, window(r, sequence) + from * element, (to - from) * element);
      }
    }
    done += n;
  } while (done < count);
}

void Communicator::all_reduce_in_buffer(Call& call, std::size_t offset, std::size_t count, ElementType type,
                                        ReduceOp op, const OpDescriptor& descriptor) {
  const std::size_t element = element_size(type);
  const int world = world_size();
  const int me = rank();
  std::byte* mine = buffer(me) + offset;
  const bool streaming = count * element >= kStreamingGatherBytes;
  void (*const gather)(void*, const void*, std::size_t) noexcept = streaming ? copy::streaming_copy : copy_bytes;
  start_barrier(call, descriptor);
  // Reduce-scatter in place (only this rank reads its own slice), then gather.
  const auto [begin, end] = slice_of(me, world, count, element);
  for (int r = 0; r < world; ++r) sources_[r] = buffer(r) + offset + begin * element;
  reduce_elements(type, op, sources_.data(), world, world, mine + begin * element, nullptr, end - begin);
  out_barrier(call, "middle");
  for (int r = 0; r < world; ++r) {
    if (r == me) continue;
    const auto [from, to] = slice_of(r, world, count, element);
    gather(mine + from * element, buffer(r) + offset + from * element, (to - from) * element);
  }
  if (streaming) copy::streaming_fence();
  out_barrier(call, "end");  // nobody reads my slice any more: the caller may write the buffer
}

// ---- all_gather, reduce_scatter, broadcast, barrier -----------------------------------

void Communicator::all_gather(const TensorView& output, const TensorView& input, std::chrono::nanoseconds timeout,
                              const sync::WaitHook& hook) {
  require_contiguous_host(input, "all_gather: input");
  require_tensor(output, "all_gather: output");
  TENSORXFER_CHECK(TypeMismatch, output.dtype == input.dtype, "all_gather: output dtype must equal input dtype ",
                   dtype_name(input.dtype), ", got ", dtype_name(output.dtype));
  const std::size_t nbytes = input.nbytes();
  TENSORXFER_CHECK(InvalidArgument, output.nbytes() == nbytes * static_cast<std::size_t>(world_size()),
                   "all_gather: output must hold world_size (", world_size(), ") x input bytes (", nbytes,
                   ") = ", nbytes * static_cast<std::size_t>(world_size()), " bytes, got ", output.nbytes());
  Call call(*this, "all_gather", timeout, hook);
  const OpDescriptor descriptor{encode_kind(Collective::kAllGather), encode_dtype(input.dtype), nbytes, 0};
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  run_operation(
      "all_gather",
      [&] {
        require_outside_windows(input, "all_gather: input"); require_outside_windows(output, "all_gather: output");
      },
      [&] {
    std::size_t done = 0;
    do {
      const std::size_t n = std::min(stage_nbytes_, nbytes - done);
      copy_bytes(window(rank(), sequence_), in + done, n);
      const uint64_t sequence = start_barrier(call, descriptor);
      for (int r = 0; r < world_size(); ++r) {
        copy_bytes(out + static_cast<std::size_t>(r) * nbytes + done, window(r, sequence), n);
      }
      done += n;
    } while (done < nbytes);
  });
}

void Communicator::reduce_scatter(const TensorView& output, const TensorView& input, ReduceOp op,
                                  std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  require_contiguous_host(input, "reduce_scatter: input");
  require_tensor(output, "reduce_scatter: output");
  const ElementType type = element_type_of(input.dtype, "reduce_scatter: input");
  TENSORXFER_CHECK(TypeMismatch, output.dtype == input.dtype, "reduce_scatter: output dtype must equal input dtype ",
                   dtype_name(input.dtype), ", got ", dtype_name(output.dtype));
  const std::size_t element = element_size(type);
  const std::size_t block = static_cast<std::size_t>(output.numel());
  const auto world = static_cast<std::size_t>(world_size());
  TENSORXFER_CHECK(InvalidArgument, static_cast<std::size_t>(input.numel()) == block * world,
                   "reduce_scatter: input must hold world_size (", world, ") x output elements (", block,
                   ") = ", block * world, " elements, got ", input.numel());
  Call call(*this, "reduce_scatter", timeout, hook);
  const OpDescriptor descriptor{encode_kind(Collective::kReduceScatter, static_cast<uint32_t>(op)),
                                encode_dtype(input.dtype), input.nbytes(), 0};
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  // stage_nbytes_for() makes room for at least one element per rank.
  const std::size_t chunk_count = stage_nbytes_ / (world * element);
  TENSORXFER_CHECK(InvalidArgument, chunk_count >= 1, "reduce_scatter: a window of ", stage_nbytes_,
                   " bytes cannot hold one ", element, "-byte element for each of ", world, " ranks");
  run_operation(
      "reduce_scatter",
      [&] {
        require_outside_windows(input, "reduce_scatter: input"); require_outside_windows(output, "reduce_scatter: output");
      },
      [&] {
    std::size_t done = 0;
    do {
      const std::size_t n = std::min(chunk_count, block - done);
      std::byte* mine = window(rank(), sequence_);
      for (std::size_t r = 0; r < world; ++r) {
        copy_bytes(mine + r * n * element, in + (r * block + done) * element, n * element);
      }
      const uint64_t sequence = start_barrier(call, descriptor);
      for (int r = 0; r < world_size(); ++r) {
        sources_[r] = window(r, sequence) + static_cast<std::size_t>(rank()) * n * element;
      }
      reduce_elements(type, op, sources_.data(), world_size(), world_size(), out + done * element, nullptr, n);
      done += n;
    } while (done < block);
  });
}

void Communicator::broadcast(const TensorView& tensor, int root, std::chrono::nanoseconds timeout,
                             const sync::WaitHook& hook) {
  require_tensor(tensor, "broadcast: tensor");
  TENSORXFER_CHECK(InvalidArgument, root >= 0 && root < world_size(), "broadcast: root must be in [0, ",
                   world_size(), "), got ", root);
  Call call(*this, "broadcast", timeout, hook);
  const std::size_t nbytes = tensor.nbytes();
  const OpDescriptor descriptor{encode_kind(Collective::kBroadcast), encode_dtype(tensor.dtype), nbytes,
                                static_cast<uint64_t>(root)};
  auto* data = static_cast<std::byte*>(tensor.data);
  run_operation(
      "broadcast",
      [&] {
        require_outside_windows(tensor, "broadcast: tensor");
      },
      [&] {
    std::size_t done = 0;
    do {
      const std::size_t n = std::min(stage_nbytes_, nbytes - done);
      if (rank() == root) copy_bytes(window(rank(), sequence_), data + done, n);
      const uint64_t sequence = start_barrier(call, descriptor);
      if (rank() != root) copy_bytes(data + done, window(root, sequence), n);
      done += n;
    } while (done < nbytes);
  });
}

void Communicator::barrier(std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  Call call(*this, "barrier", timeout, hook);
  const OpDescriptor descriptor{encode_kind(Collective::kBarrier), 0, 0, 0};
  run_operation("barrier", [] {}, [&] { start_barrier(call, descriptor); });
}

}  // namespace tensorxfer::collectives
