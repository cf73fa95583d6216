#include "tensorxfer/sync/process_local_fd.h"

#include <pthread.h>
#include <unistd.h>

#include <mutex>
#include <utility>

namespace tensorxfer::sync {

// A node of the process-wide list the fork handler walks.
struct detail::ProcessLocalFdEntry {
  int fd = -1;
  ProcessLocalFdEntry* previous = nullptr;
  ProcessLocalFdEntry* next = nullptr;
};

namespace {

struct Registry {
  std::mutex mutex;
  detail::ProcessLocalFdEntry* head = nullptr;  // guarded by mutex
};

// Never destroyed: descriptors may be closed by objects that outlive static destruction.
Registry& registry() {
  static Registry* const instance = new Registry();
  return *instance;
}

// Around fork(): hold the mutex so the child gets a consistent list and an
// unlocked mutex; in the child, close every descriptor (the parent keeps its own).
void lock_before_fork() noexcept { registry().mutex.lock(); }
void unlock_in_parent() noexcept { registry().mutex.unlock(); }
void close_all_in_child() noexcept {
  Registry& table = registry();
  for (detail::ProcessLocalFdEntry* entry = table.head; entry != nullptr; entry = entry->next) {
    if (entry->fd >= 0) ::close(entry->fd);
    entry->fd = -1;
  }
  table.mutex.unlock();
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { (void)::pthread_atfork(lock_before_fork, unlock_in_parent, close_all_in_child); });
}

}  // namespace

ProcessLocalFd::ProcessLocalFd() noexcept = default;

ProcessLocalFd::ProcessLocalFd(FileDescriptor fd) {
  if (!fd.valid()) return;
  install_fork_handler();
  auto entry = std::make_unique<detail::ProcessLocalFdEntry>();
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  entry->fd = fd.release();
  entry->next = table.head;
  if (table.head != nullptr) table.head->previous = entry.get();
  table.head = entry.get();
  entry_ = std::move(entry);
}

ProcessLocalFd::ProcessLocalFd(ProcessLocalFd&& other) noexcept : entry_(std::move(other.entry_)) {}

ProcessLocalFd& ProcessLocalFd::operator=(ProcessLocalFd&& other) noexcept {
  if (this != &other) {
    reset();
    entry_ = std::move(other.entry_);
  }
  return *this;
}

ProcessLocalFd::~ProcessLocalFd() { reset(); }

int ProcessLocalFd::get() const noexcept { return entry_ == nullptr ? -1 : entry_->fd; }

void ProcessLocalFd::reset() noexcept {
  if (entry_ == nullptr) return;
  Registry& table = registry();
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (entry_->previous != nullptr) entry_->previous->next = entry_->next;
    if (entry_->next != nullptr) entry_->next->previous = entry_->previous;
    if (table.head == entry_.get()) table.head = entry_->next;
    // Closed under the mutex: a concurrent fork() sees it either open (and the
    // child closes its copy) or gone, never half-removed.
    if (entry_->fd >= 0) ::close(entry_->fd);
  }
  entry_.reset();
}

}  // namespace tensorxfer::sync
