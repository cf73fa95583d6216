// Communicator: the collectives' chunk loops over the signal barrier.
#include "tensorxfer/collectives/communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include <unistd.h>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "communicator_internal.h"

namespace tensorxfer::collectives {
namespace {

using internal::Collective;
using internal::encode_dtype;
using internal::encode_kind;

constexpr std::size_t kPage = 4096;

std::size_t round_up_page(std::size_t value) {
  TENSORXFER_CHECK(InvalidArgument, value <= std::numeric_limits<std::size_t>::max() - kPage,
                   "Communicator: size ", value, " overflows");
  return (value + kPage - 1) / kPage * kPage;
}

const char* reduce_op_name(uint32_t kind) {
  switch (static_cast<ReduceOp>(kind >> 8 & 0xff)) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kMin: return "MIN";
  }
  return "?";
}

// The inverse of encode_dtype.
DLDataType decode_dtype(uint32_t code) {
  return DLDataType{static_cast<uint8_t>(code >> 16), static_cast<uint8_t>(code >> 8 & 0xff),
                    static_cast<uint16_t>(code & 0xff)};
}

std::string elements_text(const OpDescriptor& d) {
  const DLDataType dtype = decode_dtype(d.dtype);
  const uint64_t element_bytes = (uint64_t{dtype.bits} * std::max<uint16_t>(dtype.lanes, 1) + 7) / 8;
  if (element_bytes == 0 || d.nbytes % element_bytes != 0) return detail::concat(d.nbytes, " bytes");
  return detail::concat(d.nbytes / element_bytes, " elements");
}

// An operation in the caller's words, as "all_reduce(SUM, float32, 2097152 elements)". How an all-reduce
// ran (its algorithm; in place in the communicator's buffer or copied) follows from its size unless the
// caller chose it: it is added only where `other`, the operation set against this one, is the same call
// run differently, as only then does it explain the mismatch.
std::string describe(const OpDescriptor& d, const OpDescriptor& other) {
  const std::string dtype = dtype_name(decode_dtype(d.dtype));
  switch (static_cast<Collective>(d.kind & 0xff)) {
    case Collective::kAllReduce: {
      std::string text = detail::concat("all_reduce(", reduce_op_name(d.kind), ", ", dtype, ", ", elements_text(d));
      const bool same_call = (d.kind & 0xffff) == (other.kind & 0xffff) && d.dtype == other.dtype &&
                             d.nbytes == other.nbytes;
      if (same_call && (d.kind >> 16) != (other.kind >> 16)) {
        text += detail::concat(", ", algorithm_name(static_cast<Algorithm>(d.kind >> 16)));
      }
      if (same_call && d.aux != other.aux) {
        text += d.aux ? detail::concat(", in place at byte ", d.aux - 1, " of the buffer") : ", copied";
      }
      return text + ")";
    }
    case Collective::kAllGather: return detail::concat("all_gather(", dtype, ", ", elements_text(d), " per rank)");
    case Collective::kReduceScatter:
      return detail::concat("reduce_scatter(", reduce_op_name(d.kind), ", ", dtype, ", ", elements_text(d),
                            " in all)");
    case Collective::kBroadcast:
      return detail::concat("broadcast(", dtype, ", ", elements_text(d), ", root ", d.aux, ")");
    case Collective::kBarrier: return "barrier()";
  }
  return detail::concat("an unknown operation (kind ", d.kind, ")");
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

// spin_budget < 0: the standard policy for `world_size` waiters; else a fixed budget.
sync::SpinPolicy spin_policy(std::chrono::nanoseconds spin_budget, int world_size) {
  if (spin_budget.count() < 0) return sync::SpinPolicy::standard(world_size);
  return sync::SpinPolicy::fixed(std::chrono::duration_cast<std::chrono::microseconds>(spin_budget));
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
  // Measured (spawned ranks, float32, back to back, medians of 9 interleaved
  // loops, two runs, AMD EPYC 2 vCPUs): 2 ranks one-shot 1.1-1.3 vs two-shot
  // 1.2-1.4 us at 4-8 KiB, 2.0 vs 1.7-1.8 us at 16 KiB; 4 ranks on 2 CPUs
  // one-shot 8-15 vs 13-25 us at 4-8 KiB, 10.7-14.0 vs 14.4-16.9 us at 16 KiB,
  // two-shot ahead from 32-64 KiB.
  if (world_size <= 2) return nbytes <= (std::size_t{8} << 10) ? Algorithm::kOneShot : Algorithm::kTwoShot;
  return nbytes <= (std::size_t{16} << 10) ? Algorithm::kOneShot : Algorithm::kTwoShot;
}

// ---- one call ------------------------------------------------------------------

void Communicator::Call::wait(BarrierLines lines, uint64_t epoch, const char* stage) {
  // Two pointers: fits std::function's inline storage (no allocation per wait).
  const struct { BarrierLines lines; uint64_t epoch; } at{lines, epoch};
  const std::function<void()> watch = [this, &at] {
    try {
      if (hook) hook();
    } catch (const PeerLost&) {  // the group's liveness check, in the hook
      if (!owner.barrier_.arrived(at.lines, at.epoch)) throw;
    }
    owner.watch_peers(at.lines, at.epoch);
  };
  if (owner.barrier_.wait(lines, epoch, deadline, watch) == sync::WaitStatus::kReady) return;
  throw Timeout(detail::concat(operation, ": rank ", owner.rank(), " waited ", seconds_text(timeout), " at the ",
                               stage, " barrier; ranks not arrived: ",
                               ranks_text(owner.barrier_.missing(lines, epoch))));
}

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
      barrier_(memory_, spin_policy(spin_budget, memory_.num_workers)) {
  TENSORXFER_CHECK(Unsupported, memory_.device() == MemoryDevice::kHost,
                   "Communicator: collectives on CUDA IpcMemory need device kernels, which this build does not have");
  TENSORXFER_CHECK(InvalidArgument, memory_.is_mapped(), "Communicator: the IpcMemory must be mapped (map_peers)");
  TENSORXFER_CHECK_LE(InvalidArgument, "Communicator: IpcMemory too small", required_data_nbytes(max_bytes, buffer_bytes, memory_.num_workers),
                      memory_.data_nbytes());
  sources_.resize(static_cast<std::size_t>(memory_.num_workers));
}

void Communicator::set_spin_budget(std::chrono::nanoseconds spin_budget) {
  barrier_.set_spin_policy(spin_policy(spin_budget, world_size()));
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
      // Rank r wrote it, so it is checked like any shared word: a rank number + 1, or a corrupt segment
      // (never passed on to the other peers, never an int overflow).
      TENSORXFER_CHECK(CorruptSegment, lost_word <= static_cast<uint32_t>(world_size()), "Communicator: rank ", r,
                       "'s lost-rank word is ", lost_word, ", expected 0 (none) or a rank + 1 in 1..", world_size());
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
                                           " called ", describe(descriptor, theirs), ", rank ", rank,
                                           " called ", describe(theirs, descriptor), " (every rank must make the same calls with the same "
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

}  // namespace tensorxfer::collectives
