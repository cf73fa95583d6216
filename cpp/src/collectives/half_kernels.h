// Half-precision (bfloat16, float16) reductions for reduce.cc, one
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

namespace tensorxfer::collectives::half_kernels {

// out[i] = half(op over k of float(sources[k][i])), combined in source order in
// float32 (sum and avg add; max keeps `value > acc ? value : acc`, min `value < acc
// ? value : acc`), avg then divided by `divisor` unless it is 1; written to `second`
// too unless it is null. One pass, in registers.
using HalfReduce = void (*)(ReduceOp op, const void* const* sources, int count, int divisor, uint16_t* out,
                            uint16_t* second, std::size_t n) noexcept;

// The reduction of `kernels` (kAuto: the widest set this CPU runs) for bfloat16
// (`bfloat16` true) or float16; nullptr when the CPU cannot run that set.
HalfReduce half_reduce(HalfKernels kernels, bool bfloat16) noexcept;

}  // namespace tensorxfer::collectives::half_kernels
