// Communicator: the collectives' chunk loops over the signal barrier.
#include <algorithm>
#include <cstring>

#include "communicator_internal.h"
#include "tensorxfer/collectives/communicator.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/streaming_copy.h"

namespace tensorxfer::collectives {
namespace {

using internal::Collective;
using internal::copy_bytes;
using internal::encode_dtype;
using internal::encode_kind;
using internal::require_tensor;

// All-reduces of at least this many bytes gather the peers' slices with
// streaming stores: the caller reads the result long after, and skipping the
// read-for-ownership of every line pays once the tensor is far from the caches.
// In the buffer (2 ranks on a 2-core Xeon, result gathered after other work):
// 64 MiB 10.4 -> 9.0 ms; 16 MiB unchanged. Staged, 64 MiB float32 and
// bfloat16, spawned ranks, the two builds alternated on an Intel Xeon (SPR,
// 2 vCPUs): 4 ranks 32.9-37.8 -> 27.8-33.9 ms, 2 ranks unchanged within the
// noise (12.5-16.0 ms either way; an earlier 2-rank measurement, with the
// staged gather in 128 KiB slices, had found it slower). Not yet measured on AMD.
constexpr std::size_t kStreamingGatherBytes = std::size_t{32} << 20;

// How an all-reduce of `nbytes` copies the peers' reduced slices into place:
// streaming stores from kStreamingGatherBytes on (made visible by finish()), plain copies below.
class SliceGather {
 public:
  explicit SliceGather(std::size_t nbytes) noexcept : streaming_(nbytes >= kStreamingGatherBytes) {}
  void operator()(void* destination, const void* source, std::size_t nbytes) const noexcept {
    if (streaming_) {
      copy::streaming_copy(destination, source, nbytes);
    } else {
      copy_bytes(destination, source, nbytes);
    }
  }
  // After the last slice: orders the streaming stores before anything the caller does next.
  void finish() const noexcept {
    if (streaming_) copy::streaming_fence();
  }

 private:
  bool streaming_;
};

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

// The rank whose window holds rank `rank`'s reduced slice in a staged two-shot step.
int next_rank(int rank, int world) { return (rank + 1) % world; }

}  // namespace

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
  const SliceGather gather(count * element);
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
      // Into the result and over the next rank's copy of my slice, which I have
      // just read: its lines are in my cache, so writing them moves no line from
      // another core (my own window's slice, which a peer read last, did: 2 ranks,
      // float32, interleaved on an Intel Xeon SPR: 64 MiB 16.7-17.5 -> 14.4-15.4 ms,
      // 16 MiB 3.7-3.8 -> 3.1 ms, 1 MiB 0.21-0.27 -> 0.16-0.22 ms; 4 ranks 64 MiB 3-6%).
      std::byte* result_copy = world > 1 ? window(next_rank(me, world), sequence) + begin * element : nullptr;
      reduce_elements(type, op, sources_.data(), world, world, chunk + begin * element, result_copy, end - begin);
      out_barrier(call, "middle");
      for (int r = 0; r < world; ++r) {
        if (r == me) continue;
        const auto [from, to] = slice_of(r, world, n, element);
        gather(chunk + from * element, window(next_rank(r, world), sequence) + from * element, (to - from) * element);
      }
    }
    done += n;
  } while (done < count);
  gather.finish();
}

void Communicator::all_reduce_in_buffer(Call& call, std::size_t offset, std::size_t count, ElementType type,
                                        ReduceOp op, const OpDescriptor& descriptor) {
  const std::size_t element = element_size(type);
  const int world = world_size();
  const int me = rank();
  std::byte* mine = buffer(me) + offset;
  const SliceGather gather(count * element);
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
  gather.finish();
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
    // Peer r reads only block r of my window: my own block stays in the
    // caller's tensor, which I reduce from directly (as two-shot all_reduce does).
    const auto me = static_cast<std::size_t>(rank());
    std::size_t done = 0;
    do {
      const std::size_t n = std::min(chunk_count, block - done);
      std::byte* mine = window(rank(), sequence_);
      for (std::size_t r = 0; r < world; ++r) {
        if (r != me) copy_bytes(mine + r * n * element, in + (r * block + done) * element, n * element);
      }
      const uint64_t sequence = start_barrier(call, descriptor);
      for (std::size_t r = 0; r < world; ++r) {
        sources_[r] = r == me ? in + (me * block + done) * element
                              : window(static_cast<int>(r), sequence) + me * n * element;
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
