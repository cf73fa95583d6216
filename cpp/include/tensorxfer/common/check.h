// Argument checks that print both sides. Each throws the given Error subclass
// with "<context>: expected <a> <op> <b>, got <a>=<va>, <b>=<vb>".
#pragma once

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
