// The one error model of tensorxfer. Every failure the core reports is a
// tensorxfer::Error; the bindings map each subclass onto one Python exception:
//
//   InvalidArgument -> ValueError        (bad value, shape, size, index, state)
//   Closed          -> tensorxfer.ClosedError (a ValueError: used after close())
//   TypeMismatch    -> TypeError         (wrong dtype, wrong kind of object)
//   CorruptSegment  -> tensorxfer.CorruptSegmentError (a ValueError)
//   Timeout         -> TimeoutError
//   PeerLost        -> tensorxfer.PeerLost
//   SystemError     -> OSError with errno
//   Unsupported     -> tensorxfer.UnsupportedError
//
// Messages say what was expected and what was got.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>

namespace tensorxfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An object was used after its close(). Messages read "<kind> is closed".
// An InvalidArgument, so handlers of bad state keep catching it.
class Closed : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class TypeMismatch : public Error {
 public:
  using Error::Error;
};

// A shared segment whose header or state words fail validation.
class CorruptSegment : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

class Timeout : public Error {
 public:
  using Error::Error;
};

// The process on the other side of a shared structure has exited.
class PeerLost : public Error {
 public:
  using Error::Error;
};

// A system call failed; carries its errno.
class SystemError : public Error {
 public:
  SystemError(const std::string& what_failed, int error_number);
  int error_number() const noexcept { return error_number_; }

 private:
  int error_number_;
};

// The operation needs something this build or this machine lacks.
class Unsupported : public Error {
 public:
  using Error::Error;
};

// Throws SystemError for `what_failed` with the current errno.
[[noreturn]] void throw_system_error(const std::string& what_failed);

}  // namespace tensorxfer
