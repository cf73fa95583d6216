#include "copy_kernels.h"

#include "tensorxfer/common/cpu_features.h"
#include "tensorxfer/copy/streaming_copy.h"

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#define TENSORXFER_X86_64 1
#endif

namespace tensorxfer::copy::detail {

std::size_t last_level_cache_bytes() noexcept { return cpu_features().last_level_cache_bytes; }

#if TENSORXFER_X86_64
namespace {

constexpr std::size_t kLine = 64;

constexpr std::size_t kPage = 4096;

// AVX2 body: destination 64-byte aligned, length a multiple of 64. Copies two
// 4 KiB spans side by side (two independent streams keep more loads in
// flight than one) and prefetches the next two 128-byte sets of each; this
// beat glibc's non-temporal memcpy single-threaded on the machines measured
// (see bench/cpp/copy_bench.cc).
__attribute__((target("avx2"))) void stream_lines_avx2(char* dst, const char* src,
                                                       std::size_t nbytes) noexcept {
  std::size_t done = 0;
  for (; done + 2 * kPage <= nbytes; done += 2 * kPage) {
    const char* in = src + done;
    char* out = dst + done;
    for (std::size_t offset = 0; offset < kPage; offset += 2 * kLine) {
      _mm_prefetch(in + offset + 128, _MM_HINT_T0);
      _mm_prefetch(in + offset + 192, _MM_HINT_T0);
      _mm_prefetch(in + offset + 256, _MM_HINT_T0);
      _mm_prefetch(in + offset + 320, _MM_HINT_T0);
      _mm_prefetch(in + kPage + offset + 128, _MM_HINT_T0);
      _mm_prefetch(in + kPage + offset + 192, _MM_HINT_T0);
      _mm_prefetch(in + kPage + offset + 256, _MM_HINT_T0);
      _mm_prefetch(in + kPage + offset + 320, _MM_HINT_T0);
      const auto* a = reinterpret_cast<const __m256i*>(in + offset);
      const auto* b = reinterpret_cast<const __m256i*>(in + kPage + offset);
      const __m256i a0 = _mm256_loadu_si256(a), a1 = _mm256_loadu_si256(a + 1);
      const __m256i a2 = _mm256_loadu_si256(a + 2), a3 = _mm256_loadu_si256(a + 3);
      const __m256i b0 = _mm256_loadu_si256(b), b1 = _mm256_loadu_si256(b + 1);
      const __m256i b2 = _mm256_loadu_si256(b + 2), b3 = _mm256_loadu_si256(b + 3);
      auto* x = reinterpret_cast<__m256i*>(out + offset);
      auto* y = reinterpret_cast<__m256i*>(out + kPage + offset);
      _mm256_stream_si256(x, a0);
      _mm256_stream_si256(x + 1, a1);
      _mm256_stream_si256(x + 2, a2);
      _mm256_stream_si256(x + 3, a3);
      _mm256_stream_si256(y, b0);
      _mm256_stream_si256(y + 1, b1);
      _mm256_stream_si256(y + 2, b2);
      _mm256_stream_si256(y + 3, b3);
    }
  }
  // Less than two pages left (a packed row, the end of a copy): one stream,
  // two lines at a time, prefetching the two after the next.
  for (; done + 2 * kLine <= nbytes; done += 2 * kLine) {
    const char* in = src + done;
    _mm_prefetch(in + 256, _MM_HINT_T0);
    _mm_prefetch(in + 320, _MM_HINT_T0);
    const auto* a = reinterpret_cast<const __m256i*>(in);
    const __m256i a0 = _mm256_loadu_si256(a), a1 = _mm256_loadu_si256(a + 1);
    const __m256i a2 = _mm256_loadu_si256(a + 2), a3 = _mm256_loadu_si256(a + 3);
    auto* x = reinterpret_cast<__m256i*>(dst + done);
    _mm256_stream_si256(x, a0);
    _mm256_stream_si256(x + 1, a1);
    _mm256_stream_si256(x + 2, a2);
    _mm256_stream_si256(x + 3, a3);
  }
  for (; done < nbytes; done += kLine) {
    const auto* a = reinterpret_cast<const __m256i*>(src + done);
    const __m256i a0 = _mm256_loadu_si256(a), a1 = _mm256_loadu_si256(a + 1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + done), a0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + done) + 1, a1);
  }
}

// SSE2 body (every x86-64 CPU): same contract as the AVX2 one.
void stream_lines_sse2(char* dst, const char* src, std::size_t nbytes) noexcept {
  for (std::size_t offset = 0; offset < nbytes; offset += kLine) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + offset));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + offset + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + offset + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + offset + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + offset), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + offset + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + offset + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + offset + 48), d);
  }
}

using StreamLines = void (*)(char*, const char*, std::size_t) noexcept;

StreamLines select_stream_lines() noexcept {
  return vector_set_enabled(VectorSet::kAvx2) ? &stream_lines_avx2 : &stream_lines_sse2;
}

// Chosen once from the vector set (cpu_features.h: TENSORXFER_CPU_VECTOR_SET
// caps it); immutable afterwards.
const StreamLines kStreamLines = select_stream_lines();

}  // namespace

void streaming_copy(void* dst, const void* src, std::size_t nbytes) noexcept {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  if (nbytes < 2 * kLine) {
    std::memcpy(out, in, nbytes);
    return;
  }
  // Cached head up to the first 64-byte boundary of dst, streamed body, cached tail.
  const std::size_t head = (kLine - (reinterpret_cast<std::uintptr_t>(out) & (kLine - 1))) & (kLine - 1);
  std::memcpy(out, in, head);
  const std::size_t body = (nbytes - head) & ~(kLine - 1);
  kStreamLines(out + head, in + head, body);
  std::memcpy(out + head + body, in + head + body, nbytes - head - body);
}

void streaming_fence() noexcept { _mm_sfence(); }

void prefetch_bytes(const void* address, std::size_t nbytes) noexcept {
  const auto* bytes = static_cast<const char*>(address);
  for (std::size_t offset = 0; offset < nbytes; offset += kLine) {
    _mm_prefetch(bytes + offset, _MM_HINT_T0);
  }
}

#else  // not x86-64: plain copies, the compiler's prefetch builtin.

void streaming_copy(void* dst, const void* src, std::size_t nbytes) noexcept {
  std::memcpy(dst, src, nbytes);
}

void streaming_fence() noexcept { __atomic_thread_fence(__ATOMIC_RELEASE); }

void prefetch_bytes(const void* address, std::size_t nbytes) noexcept {
  const auto* bytes = static_cast<const char*>(address);
  for (std::size_t offset = 0; offset < nbytes; offset += 64) __builtin_prefetch(bytes + offset);
}

#endif

}  // namespace tensorxfer::copy::detail

namespace tensorxfer::copy {

void streaming_copy(void* dst, const void* src, std::size_t nbytes) noexcept {
  detail::streaming_copy(dst, src, nbytes);
}

void streaming_fence() noexcept { detail::streaming_fence(); }

}  // namespace tensorxfer::copy
