// SlotRing: a ring of fixed-size slots in one shared-memory segment, handed
// between processes: several producers, one consumer (the creator).
//
//   producer: slot = acquire_free(timeout); write slot_data(slot); publish(slot, tick_id)
//             (or abandon(slot): hand it back unpublished, e.g. after a failure)
//   consumer: ready = acquire_ready(timeout); read slot_data(ready.slot); release(ready.slot)
//
// Order: publish() takes the next publish sequence from a shared counter;
// acquire_ready() hands slots out strictly in that sequence order.
//
// Liveness: waits sleep in slices of at most sync::kWatchSlice and between
// slices check their peers. Peers are judged by liveness locks on the ring's
// segment (sync/liveness_lock.h: the consumer holds the creator's, each
// producer its entry's), never by pid, so producers and consumer may run in
// different PID namespaces (containers sharing /dev/shm). A producer waiting on
// a dead (or closed) consumer gets PeerLost. A consumer reclaims slots held in
// WRITING by dead producers, skips publish sequences a dead producer took but
// never filled, and gets PeerLost when every producer that attached is gone, at
// least one of them died without closing, and nothing is ready. (Producers
// that all closed cleanly are not "lost": another may attach, so the consumer
// waits until its timeout.)
//
// Producer entries: max_producers bounds the producers attached AT ONCE; an
// entry is reused once its producer closed or died, so a pool that re-attaches
// every epoch never runs out. A producer killed while attaching frees its entry
// as well (test hook: with TENSORXFER_FAILPOINT=slot_ring.attach.claimed in its
// environment, attach stops the process with SIGSTOP right after it claimed its
// entry and before it is active).
//
// Validation: layout values come from the validated copy taken at attach; slot
// indices and state words read from shared memory are checked before use, so
// a corrupt segment yields CorruptSegment, never an out-of-bounds access.
//
// Threads: one SlotRing object may be shared by threads (its shared-memory
// steps are serialised per object). close() from another thread makes waits in
// progress fail with "ring is closed". Objects are process-bound: in a fork()ed
// child every call throws InvalidArgument; attach again by name there. close()
// (and the destructor) in a fork()ed child only marks the copy closed: it takes
// no lock (another thread may have held the object's mutex at fork time).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tensorxfer/ipc/slot_ring_layout.h"
#include "tensorxfer/memory/shm_segment.h"
#include "tensorxfer/sync/futex.h"
#include "tensorxfer/sync/liveness_lock.h"
#include "tensorxfer/sync/wait_hook.h"

namespace tensorxfer::ipc {

struct ReadySlot {
  uint32_t slot = 0;
  uint64_t tick_id = 0;
  uint64_t publish_ns = 0;  // CLOCK_MONOTONIC nanoseconds at publish()
};

class SlotRing {
 public:
  // Wait forever (still watching peers).
  static constexpr std::chrono::nanoseconds kNoTimeout = std::chrono::nanoseconds::max();

  // Creates a ring; the calling process is its consumer. Throws InvalidArgument
  // for depth outside [1, kMaxRingDepth], slot_nbytes outside [1, kMaxSlotBytes],
  // max_producers outside [1, kMaxRingProducers]; SystemError from the OS.
  static std::unique_ptr<SlotRing> create(uint32_t depth, std::size_t slot_nbytes,
                                          sync::SpinPolicy spin = sync::SpinPolicy::standard(),
                                          uint32_t max_producers = kDefaultRingProducers);
  // Attaches as a producer. Throws what ShmSegment::attach throws, CorruptSegment
  // for a bad ring header, PeerLost if the consumer has exited or closed the ring,
  // InvalidArgument when max_producers live producers are attached now.
  static std::unique_ptr<SlotRing> attach(const std::string& name,
                                          sync::SpinPolicy spin = sync::SpinPolicy::standard());

  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;
  ~SlotRing();  // close()

  // Producer: takes a FREE slot for writing. Throws Timeout after `timeout`
  // (kNoTimeout: never), PeerLost if the consumer died or closed the ring, and
  // whatever `hook` throws (run every sync::kWatchSlice; nothing is taken then).
  uint32_t acquire_free(std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});
  // Producer: like acquire_free without waiting; nullopt if no slot is free.
  [[nodiscard]] std::optional<uint32_t> try_acquire_free();
  // Producer: makes `slot` (held by this object for writing) READY with `tick_id`.
  // Throws InvalidArgument if the slot is out of range or not held by this object.
  void publish(uint32_t slot, uint64_t tick_id);
  // Producer: hands `slot` (held by this object for writing) back FREE without
  // publishing it; the consumer never sees it. Throws InvalidArgument if the
  // slot is out of range or not held by this object for writing.
  void abandon(uint32_t slot);

  // Consumer only: the next slot in publish order. Throws Timeout after `timeout`
  // (kNoTimeout: never), PeerLost when all producers are gone (one or more died)
  // and nothing is ready, and whatever `hook` throws (as in acquire_free).
  ReadySlot acquire_ready(std::chrono::nanoseconds timeout, const sync::WaitHook& hook = {});
  // Consumer only: like acquire_ready without waiting; nullopt if nothing is ready.
  [[nodiscard]] std::optional<ReadySlot> try_acquire_ready();
  // Consumer only, thread-safe: makes the next acquire_ready / try_acquire_ready
  // (or one waiting now) throw PeerLost(message) instead of returning a slot,
  // once per report, taking nothing from the ring. For a relay that publishes
  // on behalf of producers the ring cannot watch itself (remote producers): it
  // reports one of them lost, and the consumer's next call after that goes on.
  void report_peer_lost(std::string message);
  // Consumer only: gives a slot obtained from acquire_ready back to the producers.
  // Throws InvalidArgument if out of range or not held by the consumer.
  void release(uint32_t slot);

  // The slot's bytes (slot_nbytes long, 4096-aligned). Valid until this object is destroyed.
  std::byte* slot_data(uint32_t slot) const;

  const std::string& name() const noexcept { return segment_.name(); }
  uint32_t depth() const noexcept { return layout_.depth; }
  std::size_t slot_nbytes() const noexcept { return layout_.slot_nbytes; }
  uint32_t max_producers() const noexcept { return layout_.max_producers; }
  bool is_consumer() const noexcept { return consumer_; }
  bool is_closed() const noexcept { return closed_.load(std::memory_order_relaxed); }
  // Producers attached now: attaching or active, holding their liveness lock (diagnostics).
  uint32_t live_producers() const;
  // Publish sequences skipped because their producer died before filling them.
  uint64_t skipped_sequences() const noexcept { return skipped_sequences_; }
  // Consumer: ReadySlot::publish_ns of the slot acquire_ready (or try_acquire_ready)
  // returned last; 0 before the first.
  uint64_t last_publish_ns() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_publish_ns_;
  }

  // How waits spend their time (sync/spin_policy.h).
  const sync::SpinPolicy& spin_policy() const noexcept { return spin_; }
  void set_spin_policy(const sync::SpinPolicy& spin) noexcept { spin_ = spin; }

  // Detaches: a producer returns the slots it holds for writing and frees its
  // entry; the consumer marks the ring closed (waiting producers get PeerLost)
  // and unlinks it. Memory stays mapped until destruction. Idempotent, never
  // throws; fork-safe (see Threads above).
  void close() noexcept;

 private:
  SlotRing(memory::ShmSegment segment, const RingLayout& layout, bool consumer, sync::SpinPolicy spin);

  RingControl& control() const noexcept;
  ProducerEntry& producer_entry(uint32_t index) const noexcept;
  SlotEntry& slot_entry(uint32_t slot) const noexcept;
  sync::SharedWord64& order_cell(uint64_t sequence) const noexcept;
  SlotWord load_slot_word(uint32_t slot, std::memory_order order) const;

  void check_open(const char* operation) const;        // not closed
  void check_usable(const char* operation) const;      // open, and in the process that made it
  void check_consumer(const char* operation) const;    // usable, and the consumer
  void check_slot(const char* operation, uint32_t slot) const;
  uint32_t producers_claimed() const;
  void register_producer();
  // Takes entry `index` (its lock is ours): a new generation, stale slots freed, Active.
  void activate_entry(uint32_t index, sync::LivenessLock lock);
  uint64_t claim_sequence();
  // Entry `index`'s state word, validated.
  ProducerWord load_producer_word(uint32_t index) const;
  // True if `word` (entry `index`) names a producer that is attaching or
  // active and still holds its liveness lock.
  bool producer_live(uint32_t index, const ProducerWord& word) const;
  // True if `word` names a producer that went away without closing.
  bool producer_lost(uint32_t index, const ProducerWord& word) const;
  // Frees slots WRITING(index, generation) (when `generation` is set) or
  // WRITING(index, anything but `keep`) (when it is not). True if it freed any.
  bool free_writes_of(uint32_t index, std::optional<uint64_t> generation, uint64_t keep = ~uint64_t{0}) noexcept;
  // The WRITING word this producer puts on the slots it holds.
  SlotWord my_writing_word() const noexcept;
  bool held_by_me(const SlotWord& word) const noexcept;

  // Producer step (mutex_ held).
  std::optional<uint32_t> take_free_locked();
  // Consumer steps (mutex_ held).
  std::optional<ReadySlot> take_next_locked();
  std::optional<uint32_t> find_ready_locked(uint64_t sequence) const;
  void resolve_gaps_locked();
  bool sequence_claimed_by_live_producer(uint64_t sequence) const;
  void watch_as_consumer();
  // Consumer: the oldest report_peer_lost() message not yet thrown, if any.
  std::optional<std::string> take_reported_loss();
  // Producer steps.
  void watch_as_producer();
  // Both: marks dead producers and frees the slots they held for writing.
  void reap_dead_producers();

  memory::ShmSegment segment_;
  RingLayout layout_;
  std::byte* payload_;
  bool consumer_;
  int32_t user_pid_;
  sync::ProcessIdentity consumer_identity_;
  sync::SpinPolicy spin_;
  std::optional<uint32_t> producer_index_;  // set once registered as a producer
  uint64_t producer_generation_ = 0;         // our entry's generation (valid with producer_index_)
  sync::LivenessLock producer_lock_;         // our entry's liveness lock, held until close()
  uint32_t next_free_hint_ = 0;
  uint64_t next_sequence_ = 0;  // consumer: the publish sequence acquire_ready hands out next
  uint64_t last_publish_ns_ = 0;  // consumer: publish_ns of the slot handed out last
  uint64_t skipped_sequences_ = 0;
  std::atomic<bool> closed_{false};  // relaxed suffices: a flag checked between steps
  mutable std::mutex mutex_;  // serialises this object's producer and consumer steps
  // report_peer_lost(): relaxed suffices for the flag (a hint read on every
  // acquire_ready); the messages themselves are read under reports_mutex_.
  std::atomic<bool> loss_reported_{false};
  std::mutex reports_mutex_;
  std::deque<std::string> reported_losses_;
};

}  // namespace tensorxfer::ipc
