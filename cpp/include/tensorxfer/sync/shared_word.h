// Atomic integers that live in shared memory.
//
// std::atomic is not trivially copyable, so a struct holding one cannot be
// checked with static_assert(std::is_trivially_copyable_v<...>) the way every
// shared-memory layout in tensorxfer is. SharedWord<T> is a plain integer with
// atomic accessors (the compiler's __atomic builtins, which std::atomic uses
// too, and which ThreadSanitizer understands). Every call site names its
// memory order and says why.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace tensorxfer::sync {

namespace detail {
constexpr int builtin_order(std::memory_order order) noexcept {
  switch (order) {
    case std::memory_order_relaxed: return __ATOMIC_RELAXED;
    case std::memory_order_consume: return __ATOMIC_CONSUME;
    case std::memory_order_acquire: return __ATOMIC_ACQUIRE;
    case std::memory_order_release: return __ATOMIC_RELEASE;
    case std::memory_order_acq_rel: return __ATOMIC_ACQ_REL;
    default: return __ATOMIC_SEQ_CST;
  }
}
// A failed compare-exchange may not use release semantics.
constexpr int failure_order(std::memory_order order) noexcept {
  switch (order) {
    case std::memory_order_release: return __ATOMIC_RELAXED;
    case std::memory_order_acq_rel: return __ATOMIC_ACQUIRE;
    default: return builtin_order(order);
  }
}
}  // namespace detail

template <typename T>
struct SharedWord {
  static_assert(std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>);
  static_assert(std::atomic<T>::is_always_lock_free, "shared words must be lock-free across processes");

  alignas(sizeof(T)) T raw;

  T load(std::memory_order order) const noexcept { return __atomic_load_n(&raw, detail::builtin_order(order)); }
  void store(T value, std::memory_order order) noexcept {
    __atomic_store_n(&raw, value, detail::builtin_order(order));
  }
  T fetch_add(T delta, std::memory_order order) noexcept {
    return __atomic_fetch_add(&raw, delta, detail::builtin_order(order));
  }
  T fetch_sub(T delta, std::memory_order order) noexcept {
    return __atomic_fetch_sub(&raw, delta, detail::builtin_order(order));
  }
  T exchange(T value, std::memory_order order) noexcept {
    return __atomic_exchange_n(&raw, value, detail::builtin_order(order));
  }
  // Strong compare-exchange; on failure `expected` receives the current value.
  [[nodiscard]] bool compare_exchange(T& expected, T desired, std::memory_order order) noexcept {
    return __atomic_compare_exchange_n(&raw, &expected, desired, /*weak=*/false,
                                       detail::builtin_order(order), detail::failure_order(order));
  }
};

using SharedWord32 = SharedWord<uint32_t>;
using SharedWord64 = SharedWord<uint64_t>;
static_assert(std::is_trivially_copyable_v<SharedWord32> && sizeof(SharedWord32) == 4);
static_assert(std::is_trivially_copyable_v<SharedWord64> && sizeof(SharedWord64) == 8);

}  // namespace tensorxfer::sync
