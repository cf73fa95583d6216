#include "copy_kernels.h"

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#define TENSORXFER_X86_64 1
#endif

namespace tensorxfer::copy::detail {

#if TENSORXFER_X86_64
namespace {

constexpr std::size_t kLine = 64;

// AVX2 body: destination 64-byte aligned, length a multiple of 64.
__attribute__((target("avx2"))) void stream_lines_avx2(char* dst, const char* src,
                                                       std::size_t nbytes) noexcept {
  for (std::size_t offset = 0; offset < nbytes; offset += 2 * kLine) {
    if (offset + 2 * kLine > nbytes) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset + 32));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset + 32), b);
      break;
    }
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + offset + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + offset + 96), d);
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
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? &stream_lines_avx2 : &stream_lines_sse2;
}

// Chosen once from what the CPU supports; immutable afterwards.
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
