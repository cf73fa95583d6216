// Copy engine, host stream and pack_rows against what a caller would do
// without them (memcpy, a per-row memcpy loop).
//
//   build-<you>/copy_bench --benchmark_filter=Copy
//
// The copy sizes around CopyEngineOptions::parallel_threshold show where
// splitting a copy starts to pay; BM_ParallelForDispatch shows the cost of
// handing a job to workers that are spinning (just used) or asleep.
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cpu_context.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/copy/pack.h"
#include "tensorxfer/runtime/event.h"
#include "tensorxfer/runtime/stream.h"

namespace {

using tensorxfer::TensorView;
using tensorxfer::copy::CopyEngine;
using tensorxfer::copy::CopyEngineOptions;
using tensorxfer::copy::PackLayout;
using tensorxfer::copy::PackSource;
using tensorxfer::runtime::HostStream;

// Page-aligned, pre-faulted, transparent-huge-page hinted (as numpy does for
// large arrays) buffer.
class Buffer {
 public:
  explicit Buffer(std::size_t nbytes, int fill = 1) : nbytes_(nbytes) {
    data_ = static_cast<char*>(std::aligned_alloc(4096, (nbytes + 4095) / 4096 * 4096));
    if (data_ == nullptr) throw std::bad_alloc();
    ::madvise(data_, nbytes, MADV_HUGEPAGE);
    std::memset(data_, fill, nbytes);
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return data_; }
  std::size_t size() const { return nbytes_; }

 private:
  char* data_;
  std::size_t nbytes_;
};

void copy_sizes(benchmark::internal::Benchmark* bench) {
  for (int64_t kib : {64, 256, 512, 1024, 2048, 4096, 16384, 65536}) bench->Arg(kib << 10);
  bench->UseRealTime();
}

void BM_Memcpy(benchmark::State& state) {
  const auto nbytes = static_cast<std::size_t>(state.range(0));
  Buffer src(nbytes), dst(nbytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), nbytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * nbytes));
}
BENCHMARK(BM_Memcpy)->Apply(copy_sizes);

// The engine with every split forced (threshold 0) vs its default policy.
void BM_EngineCopy(benchmark::State& state, std::size_t threshold) {
  const auto nbytes = static_cast<std::size_t>(state.range(0));
  Buffer src(nbytes), dst(nbytes, 0);
  CopyEngineOptions options;
  options.parallel_threshold = threshold;
  CopyEngine engine(options);
  for (auto _ : state) {
    engine.copy(dst.data(), src.data(), nbytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * nbytes));
  state.counters["threads"] = static_cast<double>(engine.max_parallelism());
}
BENCHMARK_CAPTURE(BM_EngineCopy, always_split, 0)->Apply(copy_sizes);
BENCHMARK_CAPTURE(BM_EngineCopy, default_policy, CopyEngineOptions{}.parallel_threshold)->Apply(copy_sizes);

// Submit + wait of one copy on a HostStream whose copies go through an engine.
void BM_HostStreamCopy(benchmark::State& state) {
  const auto nbytes = static_cast<std::size_t>(state.range(0));
  Buffer src(nbytes), dst(nbytes, 0);
  CopyEngine engine;
  HostStream stream(&engine);
  const TensorView in = TensorView::bytes(src.data(), nbytes);
  const TensorView out = TensorView::bytes(dst.data(), nbytes);
  for (auto _ : state) {
    stream.enqueue_copy(out, in);
    stream.synchronize(std::chrono::seconds(60));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * nbytes));
}
BENCHMARK(BM_HostStreamCopy)->Arg(4 << 20)->Arg(64 << 20)->UseRealTime();

// Round trip of an empty task: the stream's wake-up and completion latency.
void BM_HostStreamRoundTrip(benchmark::State& state) {
  HostStream stream;
  for (auto _ : state) {
    stream.enqueue([] {});
    stream.synchronize(std::chrono::seconds(60));
  }
}
BENCHMARK(BM_HostStreamRoundTrip)->UseRealTime();

// Cost of one two-range job: workers still spinning (gap 0) or asleep (gap 1 ms).
void BM_ParallelForDispatch(benchmark::State& state) {
  CopyEngine engine(2);
  const auto gap = std::chrono::microseconds(state.range(0));
  for (auto _ : state) {
    if (gap.count() > 0) {
      state.PauseTiming();
      std::this_thread::sleep_for(gap);
      state.ResumeTiming();
    }
    engine.parallel_for(2, 1, [](std::size_t, std::size_t) { benchmark::ClobberMemory(); });
  }
}
BENCHMARK(BM_ParallelForDispatch)->Arg(0)->Arg(1000)->UseRealTime();

// 4096 rows of 4 KiB gathered from a 512 MiB float32 store (the replay case).
struct PackCase {
  static constexpr int64_t kRows = 4096;
  static constexpr int64_t kStoreRows = (int64_t{512} << 20) / 4096;
  Buffer store{static_cast<std::size_t>(kStoreRows) * 4096};
  PackLayout layout{{{"obs", DLDataType{kDLFloat, 32, 1}, {1024}}}, kRows};
  Buffer packed{layout.nbytes(), 0};
  std::vector<int64_t> indices;
  TensorView store_view;
  TensorView index_view;

  PackCase() : indices(kRows) {
    std::mt19937_64 random(0);
    for (auto& index : indices) index = static_cast<int64_t>(random() % kStoreRows);
    store_view.data = store.data();
    store_view.dtype = {kDLFloat, 32, 1};
    store_view.shape = {kStoreRows, 1024};
    store_view.strides = {1024, 1};
    index_view.data = indices.data();
    index_view.dtype = {kDLInt, 64, 1};
    index_view.shape = {kRows};
    index_view.strides = {1};
  }
};

void BM_PackRows(benchmark::State& state) {
  PackCase c;
  CopyEngine engine;
  const bool threaded = state.range(0) != 0;
  const std::vector<PackSource> sources{{"obs", c.store_view}};
  const TensorView dst = TensorView::bytes(c.packed.data(), c.packed.size());
  for (auto _ : state) {
    tensorxfer::copy::pack_rows(dst, c.layout, sources, c.index_view, threaded ? &engine : nullptr);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.layout.nbytes()));
}
BENCHMARK(BM_PackRows)->Arg(1)->Arg(0)->ArgName("engine")->UseRealTime();

// The baseline: one memcpy per row on one thread.
void BM_GatherMemcpyLoop(benchmark::State& state) {
  PackCase c;
  for (auto _ : state) {
    for (int64_t i = 0; i < PackCase::kRows; ++i) {
      std::memcpy(c.packed.data() + i * 4096, c.store.data() + c.indices[i] * 4096, 4096);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c.layout.nbytes()));
}
BENCHMARK(BM_GatherMemcpyLoop)->UseRealTime();

}  // namespace
