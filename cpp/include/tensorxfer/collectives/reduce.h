// Element types, reduction ops and the reduction loop the collectives share.
//
// reduce_elements combines the same elements of several sources in source
// order (sources[0], then [1], ...), so every rank that reduces the same
// inputs gets bitwise-identical results whatever the chunking or the
// algorithm. Half types (bfloat16, float16) accumulate in float32 and round
// once (round to nearest even); int32 accumulates in int64; integer sums wrap
// (two's complement) like numpy's; integer avg is the sum divided by the
// rank count, truncated toward zero.
#pragma once

#include "tensorxfer/common/dlpack.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace tensorxfer::collectives {

enum class ElementType : uint32_t { kFloat32, kFloat64, kBFloat16, kFloat16, kInt32, kInt64 };
enum class ReduceOp : uint32_t { kSum, kAvg, kMax, kMin };

// Throws TypeMismatch naming `argument` for dtypes the collectives do not reduce.
ElementType element_type_of(DLDataType dtype, const char* argument);
std::size_t element_size(ElementType type) noexcept;
// "sum", "avg", "max", "min"; parse throws InvalidArgument listing the choices.
ReduceOp parse_reduce_op(const std::string& name);
const char* reduce_op_name(ReduceOp op) noexcept;

// The vector sets of the reduction: the half-precision (bfloat16, float16)
// conversion kernels, and float32 tiles (AVX2 in the avx2 and avx512 sets).
// kAuto is the widest set this CPU runs (chosen once, at first use); every set
// gives bitwise the same results, so ranks agree whatever CPU each runs on.
enum class HalfKernels : uint32_t { kAuto, kPortable, kAvx2, kAvx512 };
bool half_kernels_supported(HalfKernels kernels) noexcept;
HalfKernels best_half_kernels() noexcept;
const char* half_kernels_name(HalfKernels kernels) noexcept;

// destination[i] = op(sources[0][i], ..., sources[source_count - 1][i]) for
// i < count; also written to second_destination when it is not null.
// Destinations may alias any source (the loop reduces a tile into a private
// accumulator before it stores). `divisor` is the rank count for kAvg.
void reduce_elements(ElementType type, ReduceOp op, const void* const* sources, int source_count, int divisor,
                     void* destination, void* second_destination, std::size_t count,
                     HalfKernels half_kernels = HalfKernels::kAuto) noexcept;

// Conversions (exposed for tests): round to nearest even, subnormals kept; any NaN
// narrows to one canonical quiet NaN (bfloat16 0x7fc0, float16 0x7e00).
float bfloat16_to_float(uint16_t value) noexcept;
uint16_t float_to_bfloat16(float value) noexcept;
float float16_to_float(uint16_t value) noexcept;
uint16_t float_to_float16(float value) noexcept;

}  // namespace tensorxfer::collectives
