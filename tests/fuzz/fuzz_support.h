// What every fuzz target shares: reading typed values off the input, and the
// one outcome rule (tests/fuzz/README.md).
//
// A target feeds its bytes exactly where a peer's bytes arrive and calls the
// real decoder. The decoder may accept them (the target then checks the
// result against the decoder's documented contract) or refuse them with a
// tensorxfer::Error. Anything else is a finding: another exception type,
// a crash, a sanitizer report, a hang past the fuzzer's -timeout, memory past
// its -rss_limit_mb / -malloc_limit_mb. Findings abort, so libFuzzer keeps the
// input as a crash file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorxfer/common/error.h"

namespace tensorxfer::fuzz {

// Reads the input front to back; past its end every value reads as zero, so a
// short input is still a complete (if dull) case.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  template <typename T>
  T take() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value{};
    take_into(&value, sizeof(T));
    return value;
  }

  // An integer in [low, high] (high >= low), from as many bytes as T has.
  template <typename T>
  T take_in(T low, T high) {
    using U = std::make_unsigned_t<T>;
    const U span = static_cast<U>(static_cast<U>(high) - static_cast<U>(low));
    const U raw = take<U>();
    if (span == static_cast<U>(~U{0})) return static_cast<T>(raw);
    return static_cast<T>(static_cast<U>(low) + static_cast<U>(raw % static_cast<U>(span + 1)));
  }

  bool take_bool() { return (take<uint8_t>() & 1) != 0; }

  // Copies up to `count` bytes into `out`, zero filling past the input's end.
  void take_into(void* out, std::size_t count) {
    const std::size_t n = count < remaining() ? count : remaining();
    if (n != 0) std::memcpy(out, data_ + offset_, n);
    if (n < count) std::memset(static_cast<uint8_t*>(out) + n, 0, count - n);
    offset_ += n;
  }

  std::string take_string(std::size_t max_length) {
    const std::size_t length = take_in<std::size_t>(0, max_length);
    std::string text(length < remaining() ? length : remaining(), '\0');
    take_into(text.data(), text.size());
    return text;
  }

  std::size_t remaining() const noexcept { return size_ - offset_; }
  bool empty() const noexcept { return offset_ >= size_; }

 private:
  const uint8_t* data_;
  std::size_t size_;
  std::size_t offset_ = 0;
};

inline std::string to_text(const char* text) { return text; }
inline std::string to_text(const std::string& text) { return text; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
std::string to_text(T value) {
  return std::to_string(value);
}

template <typename... Parts>
std::string join(const Parts&... parts) {
  std::string text;
  ((text += to_text(parts)), ...);
  return text;
}

// A broken contract: print it and abort (libFuzzer then saves the input).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define TENSORXFER_FUZZ_EXPECT(condition, ...)                                                 \
  do {                                                                                         \
    if (!(condition)) {                                                                        \
      ::tensorxfer::fuzz::finding(::tensorxfer::fuzz::join("expected ", #condition, " (",      \
                                                           __FILE__, ":", __LINE__, "): ",     \
                                                           __VA_ARGS__));                      \
    }                                                                                          \
  } while (0)

// Runs `body`. Returns true when it returned normally, false when it threw
// `Refusal` (the error its contract documents, tensorxfer::Error by default).
// Any other exception is a finding.
template <typename Refusal = tensorxfer::Error, typename Body>
bool accepted(const char* what, Body&& body) {
  static_assert(std::is_base_of_v<tensorxfer::Error, Refusal>);
  try {
    body();
    return true;
  } catch (const tensorxfer::Error& error) {
    if (dynamic_cast<const Refusal*>(&error) != nullptr) return false;
    finding(std::string(what) + " threw a tensorxfer::Error of another kind than its contract says: " +
            error.what());
  } catch (const std::exception& error) {
    finding(std::string(what) + " threw a non-tensorxfer exception: " + error.what());
  } catch (...) {
    finding(std::string(what) + " threw something that is not an exception");
  }
}

}  // namespace tensorxfer::fuzz
