// Half-precision tile kernels: portable loops, and AVX2 / AVX-512F versions built
// with target attributes (the rest of the library stays at the baseline ISA) and
// chosen with __builtin_cpu_supports. Tails shorter than a vector use the
// portable conversions, which the vector code reproduces bit for bit.
#include "half_kernels.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TENSORXFER_X86_KERNELS 1
#endif

namespace tensorxfer::collectives::half_tiles {
namespace {

template <float (*Load)(uint16_t)>
void widen_portable(const uint16_t* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = Load(in[i]);
}
template <float (*Load)(uint16_t)>
void widen_add_portable(const uint16_t* in, float* acc, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + Load(in[i]);
}
template <uint16_t (*Store)(float)>
void narrow_portable(const float* in, uint16_t* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = Store(in[i]);
}

float load_bf16(uint16_t v) noexcept { return bfloat16_to_float(v); }
float load_f16(uint16_t v) noexcept { return float16_to_float(v); }
uint16_t store_bf16(float v) noexcept { return float_to_bfloat16(v); }
uint16_t store_f16(float v) noexcept { return float_to_float16(v); }

constexpr HalfTileKernels kPortableBf16{widen_portable<load_bf16>, widen_add_portable<load_bf16>,
                                        narrow_portable<store_bf16>};
constexpr HalfTileKernels kPortableF16{widen_portable<load_f16>, widen_add_portable<load_f16>,
                                       narrow_portable<store_f16>};

#ifdef TENSORXFER_X86_KERNELS
constexpr uint32_t kCanonicalNanFloat = 0x7fc00000u;  // narrows to 0x7fc0 (bf16) and 0x7e00 (f16)

// ---- AVX2 (+F16C) -----------------------------------------------------------------------
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

template <__m256 (*Load)(const uint16_t*), float (*Scalar)(uint16_t)>
TX_AVX2 void avx2_widen(const uint16_t* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Load(in + i));
  for (; i < n; ++i) out[i] = Scalar(in[i]);
}
template <__m256 (*Load)(const uint16_t*), float (*Scalar)(uint16_t)>
TX_AVX2 void avx2_widen_add(const uint16_t* in, float* acc, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), Load(in + i)));
  for (; i < n; ++i) acc[i] = acc[i] + Scalar(in[i]);
}
TX_AVX2 void avx2_bf16_narrow(const float* in, uint16_t* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i low = avx2_bf16_round(_mm256_loadu_ps(in + i));
    const __m256i high = avx2_bf16_round(_mm256_loadu_ps(in + i + 8));
    // packus interleaves 128-bit lanes: [l0-3 h0-3 l4-7 h4-7]; 0xd8 puts them back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, high), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
}
TX_AVX2 void avx2_f16_narrow(const float* in, uint16_t* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm256_cvtps_ph(avx2_canonical_nan(_mm256_loadu_ps(in + i)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), half);
  }
  for (; i < n; ++i) out[i] = float_to_float16(in[i]);
}

constexpr HalfTileKernels kAvx2Bf16{avx2_widen<avx2_bf16_load, load_bf16>,
                                    avx2_widen_add<avx2_bf16_load, load_bf16>, avx2_bf16_narrow};
constexpr HalfTileKernels kAvx2F16{avx2_widen<avx2_f16_load, load_f16>, avx2_widen_add<avx2_f16_load, load_f16>,
                                   avx2_f16_narrow};

// ---- AVX-512F -----------------------------------------------------------------------------
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

template <__m512 (*Load)(const uint16_t*), float (*Scalar)(uint16_t)>
TX_AVX512 void avx512_widen(const uint16_t* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, Load(in + i));
  for (; i < n; ++i) out[i] = Scalar(in[i]);
}
template <__m512 (*Load)(const uint16_t*), float (*Scalar)(uint16_t)>
TX_AVX512 void avx512_widen_add(const uint16_t* in, float* acc, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), Load(in + i)));
  for (; i < n; ++i) acc[i] = acc[i] + Scalar(in[i]);
}
TX_AVX512 void avx512_bf16_narrow(const float* in, uint16_t* out, std::size_t n) noexcept {
  std::size_t i = 0;
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_castps_si512(avx512_canonical_nan(_mm512_loadu_ps(in + i)));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, bias)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(rounded));
  }
  for (; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
}
TX_AVX512 void avx512_f16_narrow(const float* in, uint16_t* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i half = _mm512_cvtps_ph(avx512_canonical_nan(_mm512_loadu_ps(in + i)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), half);
  }
  for (; i < n; ++i) out[i] = float_to_float16(in[i]);
}

constexpr HalfTileKernels kAvx512Bf16{avx512_widen<avx512_bf16_load, load_bf16>,
                                      avx512_widen_add<avx512_bf16_load, load_bf16>, avx512_bf16_narrow};
constexpr HalfTileKernels kAvx512F16{avx512_widen<avx512_f16_load, load_f16>,
                                     avx512_widen_add<avx512_f16_load, load_f16>, avx512_f16_narrow};
#endif  // TENSORXFER_X86_KERNELS

}  // namespace
}  // namespace tensorxfer::collectives::half_tiles

namespace tensorxfer::collectives {

bool half_kernels_supported(HalfKernels kernels) noexcept {
  switch (kernels) {
    case HalfKernels::kAuto:
    case HalfKernels::kPortable: return true;
#ifdef TENSORXFER_X86_KERNELS
    case HalfKernels::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
    case HalfKernels::kAvx512: return __builtin_cpu_supports("avx512f") && half_kernels_supported(HalfKernels::kAvx2);
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

namespace tensorxfer::collectives::half_tiles {

const HalfTileKernels* half_tile_kernels(HalfKernels kernels, bool bfloat16) noexcept {
  if (kernels == HalfKernels::kAuto) kernels = best_half_kernels();
  if (!half_kernels_supported(kernels)) return nullptr;
  switch (kernels) {
#ifdef TENSORXFER_X86_KERNELS
    case HalfKernels::kAvx512: return bfloat16 ? &kAvx512Bf16 : &kAvx512F16;
    case HalfKernels::kAvx2: return bfloat16 ? &kAvx2Bf16 : &kAvx2F16;
#endif
    default: return bfloat16 ? &kPortableBf16 : &kPortableF16;
  }
}

}  // namespace tensorxfer::collectives::half_tiles
