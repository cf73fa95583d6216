// Argument checks that print both sides. Each throws the given Error subclass
// with "<context>: expected <a> <op> <b>, got <a>=<va>, <b>=<vb>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "tensorxfer/common/error.h"

namespace tensorxfer::detail {

template <typename Exception, typename A, typename B>
[[noreturn]] void fail_comparison(const char* context, const char* a_text, const char* op,
                                  const char* b_text, const A& a, const B& b) {
  std::ostringstream message;
  message << context << ": expected " << a_text << ' ' << op << ' ' << b_text << ", got "
          << a_text << '=' << a << ", " << b_text << '=' << b;
  throw Exception(message.str());
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace tensorxfer::detail

#define TENSORXFER_CHECK_OP_(Exception, context, a, op, b)                                    \
  do {                                                                                        \
    const auto& tx_check_a_ = (a);                                                            \
    const auto& tx_check_b_ = (b);                                                            \
    if (!(tx_check_a_ op tx_check_b_)) {                                                      \
      ::tensorxfer::detail::fail_comparison<Exception>(context, #a, #op, #b, tx_check_a_,     \
                                                       tx_check_b_);                          \
    }                                                                                         \
  } while (0)

// TENSORXFER_CHECK_EQ(InvalidArgument, "submit_h2d", dst_bytes, src_bytes);
#define TENSORXFER_CHECK_EQ(Exception, context, a, b) TENSORXFER_CHECK_OP_(Exception, context, a, ==, b)
#define TENSORXFER_CHECK_LE(Exception, context, a, b) TENSORXFER_CHECK_OP_(Exception, context, a, <=, b)
#define TENSORXFER_CHECK_LT(Exception, context, a, b) TENSORXFER_CHECK_OP_(Exception, context, a, <, b)
#define TENSORXFER_CHECK_GE(Exception, context, a, b) TENSORXFER_CHECK_OP_(Exception, context, a, >=, b)

// TENSORXFER_CHECK(InvalidArgument, ok, "ring depth must be >= 1, got ", depth);
#define TENSORXFER_CHECK(Exception, condition, ...)                            \
  do {                                                                         \
    if (!(condition)) {                                                        \
      throw Exception(::tensorxfer::detail::concat(__VA_ARGS__));              \
    }                                                                          \
  } while (0)

// Checked size arithmetic: every size computed from user or shared-memory input
// (shape products, row bytes * rows, offsets + sizes, rounding up to a page)
// goes through these, so a huge value is an InvalidArgument naming `what` and
// both operands, never a wrapped size.
namespace tensorxfer {

// a * b. Throws InvalidArgument("<what>: a * b = ... overflows ...").
inline std::size_t checked_mul(std::size_t a, std::size_t b, const char* what) {
  std::size_t product = 0;
  TENSORXFER_CHECK(InvalidArgument, !__builtin_mul_overflow(a, b, &product), what, ": ", a,
                   " * ", b, " overflows the ", sizeof(std::size_t) * 8, "-bit size type");
  return product;
}

// a + b. Throws InvalidArgument naming `what` on overflow.
inline std::size_t checked_add(std::size_t a, std::size_t b, const char* what) {
  std::size_t sum = 0;
  TENSORXFER_CHECK(InvalidArgument, !__builtin_add_overflow(a, b, &sum), what, ": ", a, " + ", b,
                   " overflows the ", sizeof(std::size_t) * 8, "-bit size type");
  return sum;
}

// The smallest multiple of `multiple` (> 0) that is >= value. Throws
// InvalidArgument naming `what` when that multiple does not fit in size_t.
inline std::size_t checked_round_up(std::size_t value, std::size_t multiple, const char* what) {
  TENSORXFER_CHECK(InvalidArgument, multiple > 0, what, ": rounding to a multiple of 0");
  const std::size_t remainder = value % multiple;
  if (remainder == 0) return value;
  std::size_t rounded = 0;
  TENSORXFER_CHECK(InvalidArgument, !__builtin_add_overflow(value, multiple - remainder, &rounded),
                   what, ": ", value, " rounded up to a multiple of ", multiple,
                   " overflows the ", sizeof(std::size_t) * 8, "-bit size type");
  return rounded;
}

// The element count of `shape`: every extent >= 0 and the product <= INT64_MAX.
// Throws InvalidArgument naming `what` otherwise.
template <typename Extents>
int64_t checked_numel(const Extents& shape, const char* what) {
  int64_t count = 1;
  for (const int64_t extent : shape) {
    TENSORXFER_CHECK(InvalidArgument, extent >= 0, what, ": negative extent ", extent, " in shape");
    TENSORXFER_CHECK(InvalidArgument, !__builtin_mul_overflow(count, extent, &count), what,
                     ": the shape has more than ", INT64_MAX, " elements");
  }
  return count;
}

}  // namespace tensorxfer
