// CudaAllReduce's host side: argument checks, the chunk loop, and the launches
// of cuda_all_reduce_kernels.cu. Builds with CUDA only; without the kernels
// (no nvcc at build time, or the fake runtime) create() raises Unsupported.
#ifdef TENSORXFER_WITH_CUDA

#include "tensorxfer/collectives/cuda_all_reduce.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <new>
#include <string>

#include "tensorxfer/collectives/element_math.h"
#include "tensorxfer/collectives/reduce.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/cuda_check.h"
#include "tensorxfer/common/cuda_device_guard.h"
#include "tensorxfer/common/cuda_runtime_calls.h"
#include "tensorxfer/common/error.h"

#ifdef TENSORXFER_WITH_CUDA_KERNELS
#include "cuda_all_reduce_kernels.h"
#endif

namespace tensorxfer::collectives {

// The words the kernels keep: [0] the epoch, [1] the first failure (device
// memory), and the failure's copy in pinned host memory.
struct CudaAllReduce::Device {
  int cuda_device = 0;
  uint64_t* words = nullptr;
  uint64_t* host_status = nullptr;
  uint64_t* host_status_for_device = nullptr;  // the same word, as the device addresses it

  ~Device() {
#ifdef TENSORXFER_WITH_CUDA_KERNELS  // only such builds allocate them (and the fake runtime has no cudaFreeHost)
    CudaDeviceGuard guard(cuda_device, std::nothrow);
    if (words != nullptr) TENSORXFER_CUDA_CALL(cudaFree(words));
    if (host_status != nullptr) TENSORXFER_CUDA_CALL(cudaFreeHost(host_status));
#endif
  }
};

#ifdef TENSORXFER_WITH_CUDA_KERNELS
namespace {

constexpr int kMaxRanks = cuda_kernels::kMaxWorldSize;

void check_peers(const CudaAllReducePeers& peers) {
  TENSORXFER_CHECK(InvalidArgument, peers.world_size >= 1 && peers.world_size <= kMaxRanks,
                   "CudaAllReduce: world_size must be in [1, ", kMaxRanks, "], got ", peers.world_size);
  TENSORXFER_CHECK(InvalidArgument, peers.rank >= 0 && peers.rank < peers.world_size,
                   "CudaAllReduce: rank must be in [0, ", peers.world_size, "), got ", peers.rank);
  TENSORXFER_CHECK(InvalidArgument, peers.cuda_device >= 0, "CudaAllReduce: cuda_device must be >= 0, got ",
                   peers.cuda_device);
  const auto world = static_cast<std::size_t>(peers.world_size);
  TENSORXFER_CHECK(InvalidArgument,
                   peers.data.size() == world && peers.barrier_in.size() == world && peers.barrier_out.size() == world,
                   "CudaAllReduce: data, barrier_in and barrier_out need one address per rank (", world, "), got ",
                   peers.data.size(), ", ", peers.barrier_in.size(), " and ", peers.barrier_out.size());
  for (std::size_t rank = 0; rank < world; ++rank) {
    TENSORXFER_CHECK(InvalidArgument,
                     peers.data[rank] != nullptr && peers.barrier_in[rank] != nullptr &&
                         peers.barrier_out[rank] != nullptr,
                     "CudaAllReduce: rank ", rank, "'s region or barrier words are not mapped (null address)");
  }
  TENSORXFER_CHECK(InvalidArgument, peers.data_nbytes >= 8, "CudaAllReduce: data_nbytes must be >= 8, got ",
                   peers.data_nbytes);
}

cuda_kernels::BarrierArgs barrier_args(const CudaAllReducePeers& peers, const std::vector<void*>& arrays,
                                       const cuda_kernels::Words& words, uint64_t descriptor, bool check_descriptor,
                                       uint64_t timeout_ns) {
  cuda_kernels::BarrierArgs args{};
  for (int rank = 0; rank < peers.world_size; ++rank) {
    args.arrays[rank] = static_cast<unsigned char*>(arrays[static_cast<std::size_t>(rank)]);
  }
  args.rank = peers.rank;
  args.world_size = peers.world_size;
  args.descriptor = descriptor;
  args.check_descriptor = check_descriptor;
  args.timeout_ns = timeout_ns;
  args.words = words;
  return args;
}

}  // namespace
#endif  // TENSORXFER_WITH_CUDA_KERNELS

CudaAllReduce::CudaAllReduce(const CudaAllReducePeers& peers, uint64_t timeout_ns)
    : peers_(peers), timeout_ns_(timeout_ns), device_(std::make_unique<Device>()) {}

CudaAllReduce::~CudaAllReduce() = default;

std::unique_ptr<CudaAllReduce> CudaAllReduce::create(const CudaAllReducePeers& peers, uint64_t timeout_ns) {
#ifndef TENSORXFER_WITH_CUDA_KERNELS
  (void)peers;
  (void)timeout_ns;
  throw Unsupported(
      "CudaAllReduce: this build of tensorxfer has no CUDA kernels (no CUDA compiler, nvcc, when it was built, "
      "or the fake CUDA runtime)");
#else
  check_peers(peers);
  TENSORXFER_CHECK(InvalidArgument, timeout_ns > 0, "CudaAllReduce: the timeout must be > 0");
  std::unique_ptr<CudaAllReduce> reducer(new CudaAllReduce(peers, timeout_ns));
  Device& device = *reducer->device_;
  device.cuda_device = peers.cuda_device;
  CudaDeviceGuard guard(peers.cuda_device);
  void* words = nullptr;
  check_cuda(TENSORXFER_CUDA_CALL(cudaMalloc(&words, 2 * sizeof(uint64_t))), "cudaMalloc(2 words)");
  device.words = static_cast<uint64_t*>(words);
  check_cuda(TENSORXFER_CUDA_CALL(cudaMemset(words, 0, 2 * sizeof(uint64_t))), "cudaMemset(2 words)");
  void* status = nullptr;
  check_cuda(TENSORXFER_CUDA_CALL(cudaHostAlloc(&status, sizeof(uint64_t), cudaHostAllocMapped)),
             "cudaHostAlloc(status word, mapped)");
  device.host_status = static_cast<uint64_t*>(status);
  *device.host_status = 0;
  void* status_for_device = nullptr;
  check_cuda(TENSORXFER_CUDA_CALL(cudaHostGetDevicePointer(&status_for_device, status, 0)),
             "cudaHostGetDevicePointer(status word)");
  device.host_status_for_device = static_cast<uint64_t*>(status_for_device);
  check_cuda(TENSORXFER_CUDA_CALL(cudaDeviceSynchronize()), "cudaDeviceSynchronize");
  return reducer;
#endif
}

uint64_t CudaAllReduce::status() const noexcept {
  return device_->host_status == nullptr ? 0 : *static_cast<volatile uint64_t*>(device_->host_status);
}

void CudaAllReduce::throw_if_failed() const {
  const uint64_t failure = status();
  if (failure == 0) return;
  const auto kind = static_cast<CudaAllReduceFailure>(failure >> 32);
  const auto peer = static_cast<uint32_t>(failure & 0xffffffffu);
  if (kind == CudaAllReduceFailure::kTimeout) {
    throw Timeout(detail::concat("CudaAllReduce: rank ", peers_.rank, " waited more than ",
                                 static_cast<double>(timeout_ns_) / 1e9, " s for rank ", peer,
                                 " at a barrier on the GPU; the communicator is unusable"));
  }
  throw InvalidArgument(detail::concat("CudaAllReduce: rank ", peer, " called all_reduce with another dtype, op, ",
                                       "algorithm or size than rank ", peers_.rank,
                                       "; the communicator is unusable"));
}

void CudaAllReduce::all_reduce(void* tensor, std::size_t count, uint32_t element_type, uint32_t op,
                               CudaAllReduceAlgorithm algorithm, void* stream) {
  throw_if_failed();
  TENSORXFER_CHECK(InvalidArgument, element_type <= static_cast<uint32_t>(ElementType::kInt64),
                   "CudaAllReduce.all_reduce: unknown element type ", element_type);
  TENSORXFER_CHECK(InvalidArgument, op <= static_cast<uint32_t>(ReduceOp::kMin),
                   "CudaAllReduce.all_reduce: unknown op ", op);
  TENSORXFER_CHECK(InvalidArgument, count < (uint64_t{1} << 47), "CudaAllReduce.all_reduce: ", count,
                   " elements is too many");
  if (count == 0) return;
  TENSORXFER_CHECK(InvalidArgument, tensor != nullptr, "CudaAllReduce.all_reduce: the tensor's address is null");
#ifndef TENSORXFER_WITH_CUDA_KERNELS
  (void)stream;
  (void)algorithm;
  throw Unsupported("CudaAllReduce: this build of tensorxfer has no CUDA kernels");
#else
  const std::size_t element_size = collectives::element_size(static_cast<ElementType>(element_type));
  if (algorithm == CudaAllReduceAlgorithm::kAuto) {
    algorithm = count * element_size <= kOneShotMaxBytes ? CudaAllReduceAlgorithm::kOneShot
                                                          : CudaAllReduceAlgorithm::kTwoShot;
  }
  const bool two_shot = algorithm == CudaAllReduceAlgorithm::kTwoShot;
  // What each rank announces at the start barrier (compared there).
  const uint64_t descriptor = (uint64_t{count} << 16) | (uint64_t{element_type} << 8) | (uint64_t{op} << 4) |
                              static_cast<uint64_t>(algorithm);
  const cuda_kernels::Words words{device_->words, device_->words + 1, device_->host_status_for_device};
  const auto start = barrier_args(peers_, peers_.barrier_in, words, descriptor, true, timeout_ns_);
  const auto after = barrier_args(peers_, peers_.barrier_out, words, descriptor, false, timeout_ns_);
  cuda_kernels::ReduceArgs reduce{};
  for (int rank = 0; rank < peers_.world_size; ++rank) reduce.sources[rank] = peers_.data[static_cast<std::size_t>(rank)];
  reduce.op = op;
  reduce.world_size = peers_.world_size;
  reduce.words = words;

  CudaDeviceGuard guard(peers_.cuda_device);
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  const std::size_t chunk = element_math::chunk_elements(peers_.data_nbytes, element_size);
  auto* bytes = static_cast<unsigned char*>(tensor);
  void* mine = peers_.data[static_cast<std::size_t>(peers_.rank)];
  for (std::size_t first = 0; first < count; first += chunk) {
    const std::size_t n = std::min(chunk, count - first);
    void* destination = bytes + first * element_size;
    check_cuda(TENSORXFER_CUDA_CALL(
                   cudaMemcpyAsync(mine, destination, n * element_size, cudaMemcpyDeviceToDevice, cuda_stream)),
               "cudaMemcpyAsync(the tensor into this rank's region)");
    check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_barrier(start, cuda_stream)), "the start barrier kernel");
    reduce.count = n;
    if (two_shot) {
      reduce.destination = mine;
      reduce.begin = element_math::slice_begin(n, peers_.world_size, peers_.rank);
      reduce.end = element_math::slice_begin(n, peers_.world_size, peers_.rank + 1);
      check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_reduce(element_type, reduce, cuda_stream)),
                 "the reduce-scatter kernel");
      check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_barrier(after, cuda_stream)), "the middle barrier kernel");
      reduce.destination = destination;
      check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_gather(element_size, reduce, cuda_stream)),
                 "the all-gather kernel");
    } else {
      reduce.destination = destination;
      reduce.begin = 0;
      reduce.end = n;
      check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_reduce(element_type, reduce, cuda_stream)),
                 "the reduce kernel");
    }
    check_cuda(TENSORXFER_CUDA_CALL(cuda_kernels::launch_barrier(after, cuda_stream)), "the end barrier kernel");
  }
#endif
}

}  // namespace tensorxfer::collectives

#endif  // TENSORXFER_WITH_CUDA
