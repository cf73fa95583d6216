// Half-precision reductions: a portable loop, and AVX2 / AVX-512F loops built
// with target attributes (the rest of the library stays at the baseline ISA) and
// chosen from cpu_features()'s vector set. Each loads 16 elements of every source,
// combines them in float32 registers and narrows once; tails shorter than 16
// elements use the portable conversions, which the vector code reproduces bit
// for bit.
#include "half_kernels.h"

#include "tensorxfer/common/cpu_features.h"

#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TENSORXFER_X86_KERNELS 1
#endif

namespace tensorxfer::collectives::half_kernels {
namespace {

enum class Combine { kAdd, kMax, kMin };

template <Combine C>
inline float combine(float acc, float value) noexcept {
  if constexpr (C == Combine::kAdd) return acc + value;
  if constexpr (C == Combine::kMax) return value > acc ? value : acc;
  return value < acc ? value : acc;
}

// Calls run(tag), tag an std::integral_constant holding op's Combine (sum and avg add).
template <typename Run>
inline void with_combine(ReduceOp op, Run&& run) noexcept {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return run(std::integral_constant<Combine, Combine::kAdd>{});
    case ReduceOp::kMax: return run(std::integral_constant<Combine, Combine::kMax>{});
    case ReduceOp::kMin: return run(std::integral_constant<Combine, Combine::kMin>{});
  }
}

inline const uint16_t* source_at(const void* const* sources, int k, std::size_t i) noexcept {
  return static_cast<const uint16_t*>(sources[k]) + i;
}

// Elements [begin, n), one at a time: the portable set, and the vector sets' tails.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), Combine C>
inline void reduce_from(const void* const* sources, int count, float divisor, uint16_t* out, uint16_t* second,
                        std::size_t begin, std::size_t n) noexcept {
  for (std::size_t i = begin; i < n; ++i) {
    float acc = Load(*source_at(sources, 0, i));
    for (int k = 1; k < count; ++k) acc = combine<C>(acc, Load(*source_at(sources, k, i)));
    if (divisor != 1.0f) acc = acc / divisor;
    out[i] = Store(acc);
    if (second != nullptr) second[i] = out[i];
  }
}

float load_bf16(uint16_t v) noexcept { return bfloat16_to_float(v); }
float load_f16(uint16_t v) noexcept { return float16_to_float(v); }
uint16_t store_bf16(float v) noexcept { return float_to_bfloat16(v); }
uint16_t store_f16(float v) noexcept { return float_to_float16(v); }

// The divisor a loop divides by: avg's, or 1 (no division).
inline float divisor_of(ReduceOp op, int divisor) noexcept {
  return op == ReduceOp::kAvg ? static_cast<float>(divisor) : 1.0f;
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void reduce_portable(ReduceOp op, const void* const* sources, int count, int divisor, uint16_t* out, uint16_t* second,
                     std::size_t n) noexcept {
  const float by = divisor_of(op, divisor);
  with_combine(op, [&](auto combine) {
    reduce_from<Load, Store, decltype(combine)::value>(sources, count, by, out, second, 0, n);
  });
}

#ifdef TENSORXFER_X86_KERNELS
constexpr uint32_t kCanonicalNanFloat = 0x7fc00000u;  // narrows to 0x7fc0 (bf16) and 0x7e00 (f16)

// ---- AVX2 (+F16C): 16 elements as two 8-lane halves ----------------------------------------
#define TX_AVX2 __attribute__((target("avx2,f16c,fma")))

TX_AVX2 inline __m256 avx2_bf16_load(const uint16_t* in) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
TX_AVX2 inline __m256 avx2_f16_load(const uint16_t* in) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
}
TX_AVX2 inline __m256 avx2_canonical_nan(__m256 v) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanonicalNanFloat)));
  return _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
// Round to nearest even on the bits: bits + 0x7fff + (bit 16), keep the high half.
TX_AVX2 inline __m256i avx2_bf16_round(__m256 v) {
  const __m256i bits = _mm256_castps_si256(avx2_canonical_nan(v));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
}
TX_AVX2 inline __m256i avx2_bf16_pack16(__m256 low, __m256 high) {
  // packus interleaves 128-bit lanes: [l0-3 h0-3 l4-7 h4-7]; 0xd8 puts them back in order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(avx2_bf16_round(low), avx2_bf16_round(high)), 0xd8);
}
TX_AVX2 inline __m128i avx2_f16_round(__m256 v) {
  return _mm256_cvtps_ph(avx2_canonical_nan(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
TX_AVX2 inline __m256i avx2_f16_pack16(__m256 low, __m256 high) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(avx2_f16_round(low)), avx2_f16_round(high), 1);
}
// 16 narrowed elements, stored to `out` and, when not null, `second`: narrowed once.
TX_AVX2 inline void store16_twice(uint16_t* out, uint16_t* second, __m256i packed) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
  if (second != nullptr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(second), packed);
}
// MAXPS/MINPS return their second operand unless the first compares greater/less:
// (value, acc) is `value > acc ? value : acc`, as the portable loop.
template <Combine C>
TX_AVX2 inline __m256 avx2_combine(__m256 acc, __m256 value) {
  if constexpr (C == Combine::kAdd) return _mm256_add_ps(acc, value);
  if constexpr (C == Combine::kMax) return _mm256_max_ps(value, acc);
  return _mm256_min_ps(value, acc);
}

template <__m256 (*Load)(const uint16_t*), __m256i (*Pack16)(__m256, __m256), float (*LoadScalar)(uint16_t),
          uint16_t (*StoreScalar)(float), Combine C>
TX_AVX2 void avx2_reduce_loop(const void* const* sources, int count, float divisor, uint16_t* out, uint16_t* second,
                              std::size_t n) noexcept {
  const __m256 by = _mm256_set1_ps(divisor);
  const bool divide = divisor != 1.0f;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 low = Load(source_at(sources, 0, i)), high = Load(source_at(sources, 0, i + 8));
    for (int k = 1; k < count; ++k) {
      low = avx2_combine<C>(low, Load(source_at(sources, k, i)));
      high = avx2_combine<C>(high, Load(source_at(sources, k, i + 8)));
    }
    if (divide) low = _mm256_div_ps(low, by), high = _mm256_div_ps(high, by);
    store16_twice(out + i, second == nullptr ? nullptr : second + i, Pack16(low, high));
  }
  reduce_from<LoadScalar, StoreScalar, C>(sources, count, divisor, out, second, i, n);
}

template <__m256 (*Load)(const uint16_t*), __m256i (*Pack16)(__m256, __m256), float (*LoadScalar)(uint16_t),
          uint16_t (*StoreScalar)(float)>
void avx2_reduce(ReduceOp op, const void* const* sources, int count, int divisor, uint16_t* out, uint16_t* second,
                 std::size_t n) noexcept {
  const float by = divisor_of(op, divisor);
  with_combine(op, [&](auto combine) {
    avx2_reduce_loop<Load, Pack16, LoadScalar, StoreScalar, decltype(combine)::value>(sources, count, by, out, second,
                                                                                    n);
  });
}

// ---- AVX-512F: 16 elements in one register ------------------------------------------------
#define TX_AVX512 __attribute__((target("avx512f,avx2,f16c,fma")))

TX_AVX512 inline __m512 avx512_bf16_load(const uint16_t* in) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
TX_AVX512 inline __m512 avx512_f16_load(const uint16_t* in) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
}
TX_AVX512 inline __m512 avx512_canonical_nan(__m512 v) {
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kCanonicalNanFloat)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, nan);
}
TX_AVX512 inline __m256i avx512_bf16_pack16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(avx512_canonical_nan(v));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_cvtepi32_epi16(rounded);
}
TX_AVX512 inline __m256i avx512_f16_pack16(__m512 v) {
  return _mm512_cvtps_ph(avx512_canonical_nan(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
template <Combine C>
TX_AVX512 inline __m512 avx512_combine(__m512 acc, __m512 value) {
  if constexpr (C == Combine::kAdd) return _mm512_add_ps(acc, value);
  if constexpr (C == Combine::kMax) return _mm512_max_ps(value, acc);
  return _mm512_min_ps(value, acc);
}

template <__m512 (*Load)(const uint16_t*), __m256i (*Pack16)(__m512), float (*LoadScalar)(uint16_t),
          uint16_t (*StoreScalar)(float), Combine C>
TX_AVX512 void avx512_reduce_loop(const void* const* sources, int count, float divisor, uint16_t* out,
                                  uint16_t* second, std::size_t n) noexcept {
  const __m512 by = _mm512_set1_ps(divisor);
  const bool divide = divisor != 1.0f;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 acc = Load(source_at(sources, 0, i));
    for (int k = 1; k < count; ++k) acc = avx512_combine<C>(acc, Load(source_at(sources, k, i)));
    if (divide) acc = _mm512_div_ps(acc, by);
    store16_twice(out + i, second == nullptr ? nullptr : second + i, Pack16(acc));
  }
  reduce_from<LoadScalar, StoreScalar, C>(sources, count, divisor, out, second, i, n);
}

template <__m512 (*Load)(const uint16_t*), __m256i (*Pack16)(__m512), float (*LoadScalar)(uint16_t),
          uint16_t (*StoreScalar)(float)>
void avx512_reduce(ReduceOp op, const void* const* sources, int count, int divisor, uint16_t* out, uint16_t* second,
                   std::size_t n) noexcept {
  const float by = divisor_of(op, divisor);
  with_combine(op, [&](auto combine) {
    avx512_reduce_loop<Load, Pack16, LoadScalar, StoreScalar, decltype(combine)::value>(sources, count, by, out,
                                                                                      second, n);
  });
}
#endif  // TENSORXFER_X86_KERNELS

}  // namespace
}  // namespace tensorxfer::collectives::half_kernels

namespace tensorxfer::collectives {

// The CPU's vector set, capped by TENSORXFER_CPU_VECTOR_SET (cpu_features.h):
// forcing avx2 runs the kernels an AVX2-only CPU runs.
bool half_kernels_supported(HalfKernels kernels) noexcept {
  switch (kernels) {
    case HalfKernels::kAuto:
    case HalfKernels::kPortable: return true;
#ifdef TENSORXFER_X86_KERNELS
    case HalfKernels::kAvx2: return vector_set_enabled(VectorSet::kAvx2);
    case HalfKernels::kAvx512: return vector_set_enabled(VectorSet::kAvx512);
#else
    case HalfKernels::kAvx2:
    case HalfKernels::kAvx512: return false;
#endif
  }
  return false;
}

const char* half_kernels_name(HalfKernels kernels) noexcept {
  switch (kernels) {
    case HalfKernels::kAuto: return "auto";
    case HalfKernels::kPortable: return "portable";
    case HalfKernels::kAvx2: return "avx2";
    case HalfKernels::kAvx512: return "avx512";
  }
  return "?";
}

HalfKernels best_half_kernels() noexcept {
  static const HalfKernels best = half_kernels_supported(HalfKernels::kAvx512) ? HalfKernels::kAvx512
                                  : half_kernels_supported(HalfKernels::kAvx2) ? HalfKernels::kAvx2
                                                                               : HalfKernels::kPortable;
  return best;
}

}  // namespace tensorxfer::collectives

namespace tensorxfer::collectives::half_kernels {

HalfReduce half_reduce(HalfKernels kernels, bool bfloat16) noexcept {
  if (kernels == HalfKernels::kAuto) kernels = best_half_kernels();
  if (!half_kernels_supported(kernels)) return nullptr;
  switch (kernels) {
#ifdef TENSORXFER_X86_KERNELS
    case HalfKernels::kAvx512:
      return bfloat16 ? avx512_reduce<avx512_bf16_load, avx512_bf16_pack16, load_bf16, store_bf16>
                      : avx512_reduce<avx512_f16_load, avx512_f16_pack16, load_f16, store_f16>;
    case HalfKernels::kAvx2:
      return bfloat16 ? avx2_reduce<avx2_bf16_load, avx2_bf16_pack16, load_bf16, store_bf16>
                      : avx2_reduce<avx2_f16_load, avx2_f16_pack16, load_f16, store_f16>;
#endif
    default: return bfloat16 ? reduce_portable<load_bf16, store_bf16> : reduce_portable<load_f16, store_f16>;
  }
}

}  // namespace tensorxfer::collectives::half_kernels
