// The fake runtime's state, its log, failure rules, the GIL probe and the control API.
#include "fake_cuda_state.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

namespace tensorxfer::cuda_fake {
namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local int thread_device = 0;

// 1 / 0 when a Python interpreter runs in this process and the thread holds / does not
// hold its GIL; -1 without Python. Looked up each time: the extension may load Python late.
int probe_gil() {
  using Check = int (*)();
  auto initialized = reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  auto gil_check = reinterpret_cast<Check>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
  if (initialized == nullptr || gil_check == nullptr || initialized() == 0) return -1;
  return gil_check();
}

}  // namespace

State& state() {
  static State* instance = new State();  // never destroyed: calls may come from exit handlers
  return *instance;
}

int& current_device() { return thread_device; }

std::string hex(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", pointer);
  return text;
}

Entry::Entry(const char* function, std::string arguments, Needs needs, bool blocking) {
  const int gil = blocking ? probe_gil() : -1;
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  Call call;
  call.sequence = s.next_sequence++;
  call.function = function;
  call.arguments = std::move(arguments);
  call.thread = static_cast<long>(syscall(SYS_gettid));
  call.device = thread_device;
  call.blocking = blocking;
  call.gil_held = gil;
  if (gil == 1) ++s.gil_violations;
  if (needs != Needs::kNothing && s.driver_version < CUDART_VERSION) {
    early_ = cudaErrorInsufficientDriver;
  } else if (needs == Needs::kContext && s.device_count == 0) {
    early_ = cudaErrorNoDevice;
  }
  auto rule = s.rules.find(function);
  if (early_ == cudaSuccess && rule != s.rules.end() && rule->second.times != 0) {
    if (rule->second.skip > 0) {
      --rule->second.skip;
    } else {
      early_ = static_cast<cudaError_t>(rule->second.error);
      if (rule->second.times > 0) --rule->second.times;
    }
  }
  if (early_ == cudaSuccess && needs == Needs::kContext && thread_device >= 0 &&
      static_cast<std::size_t>(thread_device) < s.contexts.size()) {
    s.contexts[static_cast<std::size_t>(thread_device)] = true;
  }
  index_ = s.log.size();
  s.log.push_back(std::move(call));
}

cudaError_t Entry::finish(cudaError_t result) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  if (index_ < s.log.size()) s.log[index_].result = static_cast<int>(result);
  if (result != cudaSuccess) last_error = result;
  return result;
}

cudaError_t take_last_error(bool reset) {
  const cudaError_t error = last_error;
  if (reset) last_error = cudaSuccess;
  return error;
}

std::vector<Call> calls() {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().log;
}

std::vector<ManagedRequest> managed_requests() {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().managed_requests;
}

}  // namespace tensorxfer::cuda_fake

using namespace tensorxfer::cuda_fake;

extern "C" {

void tx_fake_cuda_reset(void) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mutex);
  s.device_count = 1;
  s.driver_version = CUDART_VERSION;
  s.concurrent_managed_access = true;
  s.rules.clear();
  s.log.clear();
  s.gil_violations = 0;
  s.freed_while_imported = 0;
  s.contexts.assign(s.contexts.size(), false);
  s.managed_requests.clear();
  thread_device = 0;
  last_error = cudaSuccess;
}

void tx_fake_cuda_set_device_count(int count) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().device_count = count;
}

void tx_fake_cuda_set_driver_version(int version) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().driver_version = version;
}

void tx_fake_cuda_set_concurrent_managed_access(int enabled) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().concurrent_managed_access = enabled != 0;
}

void tx_fake_cuda_fail(const char* function, int error, int skip, int times) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  state().rules[function] = Rule{error, skip, times};
}

std::uint64_t tx_fake_cuda_gil_violations(void) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().gil_violations;
}

std::uint64_t tx_fake_cuda_freed_while_imported(void) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().freed_while_imported;
}

std::uint64_t tx_fake_cuda_open_imports(void) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  std::uint64_t count = 0;
  for (const auto& entry : state().memory) {
    if (entry.second.kind == MemoryKind::kImported) count += static_cast<std::uint64_t>(entry.second.open_count);
  }
  return count;
}

std::uint64_t tx_fake_cuda_live_allocations(void) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  std::uint64_t count = 0;
  for (const auto& entry : state().memory) count += entry.second.kind != MemoryKind::kImported ? 1 : 0;
  return count;
}

std::uint64_t tx_fake_cuda_registered_ranges(void) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().registered.size();
}

int tx_fake_cuda_context_created(int device) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  if (device < 0 || static_cast<std::size_t>(device) >= state().contexts.size()) return 0;
  return state().contexts[static_cast<std::size_t>(device)] ? 1 : 0;
}

}  // extern "C"
