// SlotRing peer bookkeeping: producer registration, liveness watches, reaping
// the slots of dead producers and skipping the sequences they abandoned.
#include <unistd.h>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {

uint32_t SlotRing::producers_claimed() const {
  // acquire: entries below the count have been handed out (their state word decides the rest).
  const uint32_t claimed = control().producers_claimed.load(std::memory_order_acquire);
  TENSORXFER_CHECK(CorruptSegment, claimed <= layout_.max_producers, "SlotRing '", name(), "': producer count ",
                   claimed, " exceeds max_producers ", layout_.max_producers);
  return claimed;
}

void SlotRing::register_producer() {
  const sync::ProcessIdentity self = sync::current_process_identity();
  uint32_t index = producers_claimed();
  do {
    TENSORXFER_CHECK(InvalidArgument, index < layout_.max_producers, "SlotRing::attach(", name(), "): all ",
                     layout_.max_producers, " producer entries have been used (entries are not reused); ",
                     "create the ring with a larger max_producers");
    // acq_rel: hands out each index exactly once.
  } while (!control().producers_claimed.compare_exchange(index, index + 1, std::memory_order_acq_rel));
  ProducerEntry& entry = producer_entry(index);
  entry.identity = self;
  entry.claim.store(0, std::memory_order_relaxed);  // relaxed: published by the release below
  // release: whoever reads Active also reads our identity.
  entry.state.store(kProducerActive, std::memory_order_release);
  producer_index_ = index;
}

uint32_t SlotRing::live_producers() const {
  uint32_t live = 0;
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    const ProducerEntry& entry = producer_entry(index);
    // acquire: pairs with register_producer's release (identity written).
    const uint32_t state = entry.state.load(std::memory_order_acquire);
    if (state == kProducerAttaching || (state == kProducerActive && sync::is_alive(entry.identity))) ++live;
  }
  return live;
}

void SlotRing::reap_dead_producers() {
  bool freed = false;
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    ProducerEntry& entry = producer_entry(index);
    uint32_t state = entry.state.load(std::memory_order_acquire);  // acquire: identity is readable
    if (state == kProducerActive && !sync::is_alive(entry.identity)) {
      // acq_rel: exactly one reaper marks it; the others reload the state.
      if (entry.state.compare_exchange(state, kProducerDead, std::memory_order_acq_rel)) state = kProducerDead;
    }
    if (state != kProducerDead) continue;
    for (uint32_t slot = 0; slot < layout_.depth; ++slot) {
      const SlotWord word = load_slot_word(slot, std::memory_order_relaxed);  // relaxed: the CAS decides
      if (word.state != SlotState::kWriting || word.producer != index) continue;
      uint64_t expected = word.encode();
      // release: like release(); the next writer's acquire pairs with it.
      if (slot_entry(slot).state.compare_exchange(expected, SlotWord{SlotState::kFree, 0, 0}.encode(),
                                                  std::memory_order_release)) {
        freed = true;
      }
    }
  }
  if (freed) control().free_event.notify_all();
}

bool SlotRing::sequence_claimed_by_live_producer(uint64_t sequence) const {
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    const ProducerEntry& entry = producer_entry(index);
    // seq_cst: see claim_sequence(); the claim is announced before the counter moves.
    if (entry.claim.load(std::memory_order_seq_cst) != sequence + 1) continue;
    const uint32_t state = entry.state.load(std::memory_order_acquire);  // acquire: identity is readable
    if (state == kProducerAttaching) return true;
    if (state == kProducerActive && sync::is_alive(entry.identity)) return true;
  }
  return false;
}

void SlotRing::resolve_gaps_locked() {
  // Bounded: each pass either returns or skips one of at most depth + max_producers sequences.
  for (uint32_t pass = 0; pass <= layout_.depth + layout_.max_producers; ++pass) {
    const uint64_t sequence = next_sequence_;
    // seq_cst: pairs with claim_sequence()'s counter update.
    const uint64_t published = control().publish_counter.load(std::memory_order_seq_cst);
    if (published <= sequence) return;
    if (find_ready_locked(sequence)) return;
    if (sequence_claimed_by_live_producer(sequence)) return;
    // The claimer may have published and cleared its claim between the two looks.
    if (find_ready_locked(sequence)) return;
    // Taken by a producer that died (or failed) before filling it: skip it.
    ++next_sequence_;
    ++skipped_sequences_;
  }
}

void SlotRing::watch_as_consumer() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open("SlotRing::acquire_ready");
  reap_dead_producers();
  resolve_gaps_locked();
  // acquire: as in take_next_locked.
  if (control().publish_counter.load(std::memory_order_acquire) > next_sequence_) return;  // something coming
  // Producers that closed cleanly are not lost: another may still attach, so
  // only when every producer is gone and at least one died is the wait hopeless.
  const uint32_t claimed = producers_claimed();
  uint32_t live = 0;
  uint32_t dead = 0;
  for (uint32_t index = 0; index < claimed; ++index) {
    const ProducerEntry& entry = producer_entry(index);
    const uint32_t state = entry.state.load(std::memory_order_acquire);  // acquire: identity is readable
    if (state == kProducerAttaching || (state == kProducerActive && sync::is_alive(entry.identity))) ++live;
    if (state == kProducerDead || (state == kProducerActive && !sync::is_alive(entry.identity))) ++dead;
  }
  TENSORXFER_CHECK(PeerLost, live > 0 || dead == 0, "SlotRing '", name(), "': all ", claimed,
                   " producers that attached have exited or closed (", dead,
                   " died without closing), and no slot is ready");
}

void SlotRing::watch_as_producer() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_open("SlotRing::acquire_free");
  if (!consumer_) {
    // acquire: pairs with close()'s release.
    const uint32_t state = control().consumer_state.load(std::memory_order_acquire);
    TENSORXFER_CHECK(PeerLost, state != kConsumerClosed, "SlotRing '", name(),
                     "': the consumer has closed the ring");
    TENSORXFER_CHECK(CorruptSegment, state == kConsumerOpen, "SlotRing '", name(), "': consumer state ", state,
                     " is not a known state");
    if (!sync::is_alive(consumer_identity_)) {
      segment_.unlink();  // its creator is gone: nobody else will remove the name
      throw PeerLost("SlotRing '" + name() + "': the consumer (" + consumer_identity_.describe() +
                     ") has exited");
    }
  }
  reap_dead_producers();
}

}  // namespace tensorxfer::ipc
