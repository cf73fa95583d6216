// LocalGroup internals shared by local_group.cc and local_group_membership.cc:
// the guards every call that touches the segment holds.
#pragma once

#include <atomic>
#include <exception>
#include <string>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/group/local_group.h"

namespace tensorxfer::group {

inline std::string quoted(const std::string& name) { return "'" + name + "'"; }

// A call that reads the segment: close() waits until none is left.
class LocalGroup::Use {
 public:
  Use(const LocalGroup& group, const char* operation) : users_(*group.users_) {
    users_.fetch_add(1, std::memory_order_seq_cst);
    if (group.closing_->load(std::memory_order_seq_cst) || group.segment_ == nullptr) {
      users_.fetch_sub(1, std::memory_order_seq_cst);
      throw Closed("LocalGroup::" + std::string(operation) + ": LocalGroup " + quoted(group.name_) + " is closed");
    }
  }
  ~Use() { users_.fetch_sub(1, std::memory_order_seq_cst); }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;

 private:
  std::atomic<int>& users_;
};

// The one collective of this rank in flight; a failure inside marks the rank
// as having given up, so peers stop waiting for it.
class LocalGroup::Operation {
 public:
  Operation(LocalGroup& group, const char* operation) : group_(group), use_(group, operation) {
    TENSORXFER_CHECK(InvalidArgument, !group.busy_->exchange(true, std::memory_order_acquire), "LocalGroup::",
                     operation, "(", quoted(group.name_), "): one operation at a time: another thread is running ",
                     "a collective on this group");
  }
  ~Operation() {
    if (std::uncaught_exceptions() > exceptions_ && !consistent_) group_.abandon();
    group_.busy_->store(false, std::memory_order_release);
  }
  // The failure about to be thrown happens on every rank alike: the ranks stay in step.
  void fail_consistently() noexcept { consistent_ = true; }
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

 private:
  LocalGroup& group_;
  Use use_;
  int exceptions_ = std::uncaught_exceptions();
  bool consistent_ = false;
};

}  // namespace tensorxfer::group
