#include "tensorxfer/runtime/event.h"

#include <sstream>

#include "tensorxfer/common/error.h"
#include "watched_wait.h"

namespace tensorxfer::runtime {
namespace detail {

uint64_t EventState::begin_record() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ++recorded_;
}

void EventState::complete(uint64_t generation, std::exception_ptr error) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (generation <= completed_) return;
    completed_ = generation;
    error_ = std::move(error);
  }
  completed_changed_.notify_all();
}

uint64_t EventState::recorded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_;
}

bool EventState::is_complete(uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= generation;
}

bool EventState::wait_for(uint64_t generation, std::optional<Seconds> timeout, const sync::WaitHook& hook) const {
  const auto deadline = deadline_after(timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!wait_watching(lock, completed_changed_, deadline, hook, [&] { return completed_ >= generation; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

void EventState::reset() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  completed_ = recorded_;
  error_ = nullptr;
}

}  // namespace detail

HostEvent::HostEvent() : state_(std::make_shared<detail::EventState>()) {}

bool HostEvent::query() const noexcept {
  try {
    return state_->is_complete(state_->recorded());
  } catch (...) {  // std::mutex::lock only throws on a broken system
    return false;
  }
}

bool HostEvent::wait_for(Seconds timeout, const sync::WaitHook& hook) const {
  return state_->wait_for(state_->recorded(), timeout, hook);
}

void HostEvent::wait(std::optional<Seconds> timeout, const sync::WaitHook& hook) const {
  if (!state_->wait_for(state_->recorded(), timeout, hook)) {
    std::ostringstream message;
    message << "HostEvent.wait: the recorded work was not done after " << timeout->count() << " s";
    throw Timeout(message.str());
  }
}

void HostEvent::reset() noexcept { state_->reset(); }

}  // namespace tensorxfer::runtime
