#include "tensorxfer/runtime/event.h"

#include <sstream>

#include "tensorxfer/common/error.h"

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

bool EventState::wait_for(uint64_t generation, Seconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::min(std::max(timeout, Seconds(0)), Seconds(1e7)));  // 1e7 s: no overflow
  if (!completed_changed_.wait_for(lock, limit, [&] { return completed_ >= generation; })) {
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

bool HostEvent::wait_for(Seconds timeout) const {
  return state_->wait_for(state_->recorded(), timeout);
}

void HostEvent::wait(std::optional<Seconds> timeout) const {
  const uint64_t generation = state_->recorded();
  if (!timeout) {
    while (!state_->wait_for(generation, Seconds(3600))) {
    }
    return;
  }
  if (!state_->wait_for(generation, *timeout)) {
    std::ostringstream message;
    message << "HostEvent.wait: the recorded work was not done after " << timeout->count() << " s";
    throw Timeout(message.str());
  }
}

void HostEvent::reset() noexcept { state_->reset(); }

}  // namespace tensorxfer::runtime
