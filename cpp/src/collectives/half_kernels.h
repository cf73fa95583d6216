// Half-precision (bfloat16, float16) <-> float32 tile kernels for reduce.cc, one
// set per instruction set (portable, AVX2 (+F16C for float16), AVX-512F), picked at
// run time from what the CPU supports. Every set gives bitwise the same results as
// the portable one: widening is exact; narrowing rounds to nearest even, keeps
// subnormals, and writes one canonical quiet NaN (bfloat16 0x7fc0, float16 0x7e00)
// for any NaN, so no result depends on which operand's NaN payload an addition kept.
// (AVX512_BF16's VCVTNEPS2BF16 flushes subnormal inputs to zero, so it is not used.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensorxfer/collectives/reduce.h"

namespace tensorxfer::collectives::half_tiles {

struct HalfTileKernels {
  // out[i] = float(in[i])
  void (*widen)(const uint16_t* in, float* out, std::size_t n) noexcept;
  // acc[i] = acc[i] + float(in[i])
  void (*widen_add)(const uint16_t* in, float* acc, std::size_t n) noexcept;
  // out[i] = half(in[i]) (round to nearest even, canonical NaN)
  void (*narrow)(const float* in, uint16_t* out, std::size_t n) noexcept;
};

// The kernels of `kernels` (kAuto: the widest set this CPU runs) for bfloat16
// (`bfloat16` true) or float16; nullptr when the CPU cannot run that set.
const HalfTileKernels* half_tile_kernels(HalfKernels kernels, bool bfloat16) noexcept;

}  // namespace tensorxfer::collectives::half_tiles
