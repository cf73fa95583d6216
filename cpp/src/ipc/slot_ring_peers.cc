// SlotRing peer bookkeeping: claiming (and reusing) producer entries, liveness
// watches, reaping the slots of lost producers and skipping the sequences they
// abandoned. Liveness is read from the segment's liveness locks (see
// slot_ring_layout.h), never from pids.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/ipc/slot_ring.h"

namespace tensorxfer::ipc {
namespace {

// Test hook (see slot_ring.h): stops this process at the named point when
// TENSORXFER_FAILPOINT names it.
void failpoint(const char* point) noexcept {
  const char* armed = std::getenv("TENSORXFER_FAILPOINT");
  if (armed != nullptr && std::strcmp(armed, point) == 0) (void)::raise(SIGSTOP);
}

}  // namespace

uint32_t SlotRing::producers_claimed() const {
  // acquire: entries below the mark may have been claimed (their state word decides the rest).
  const uint32_t claimed = control().producers_claimed.load(std::memory_order_acquire);
  TENSORXFER_CHECK(CorruptSegment, claimed <= layout_.max_producers, "SlotRing '", name(), "': producer count ",
                   claimed, " exceeds max_producers ", layout_.max_producers);
  return claimed;
}

ProducerWord SlotRing::load_producer_word(uint32_t index) const {
  // acquire: pairs with the release that wrote the state (and the entry before it).
  const uint64_t raw = producer_entry(index).state.load(std::memory_order_acquire);
  ProducerWord word;
  TENSORXFER_CHECK(CorruptSegment, ProducerWord::decode(raw, word), "SlotRing '", name(), "': producer entry ",
                   index, " has an invalid state word 0x", std::hex, raw);
  return word;
}

bool SlotRing::producer_live(uint32_t index, const ProducerWord& word) const {
  return (word.state == kProducerAttaching || word.state == kProducerActive) &&
         segment_.participant_alive(kProducerParticipantBase + index);
}

bool SlotRing::producer_lost(uint32_t index, const ProducerWord& word) const {
  if (word.state == kProducerDead) return true;
  return (word.state == kProducerAttaching || word.state == kProducerActive) &&
         !segment_.participant_alive(kProducerParticipantBase + index);
}

void SlotRing::register_producer() {
  for (uint32_t index = 0; index < layout_.max_producers; ++index) {
    const uint32_t participant = kProducerParticipantBase + index;
    if (segment_.participant_alive(participant)) continue;  // cheap look first; the lock decides
    std::optional<sync::LivenessLock> lock = segment_.try_hold_liveness(participant);
    if (!lock) continue;  // a live producer took it meanwhile
    activate_entry(index, std::move(*lock));
    return;
  }
  throw InvalidArgument("SlotRing::attach(" + name() + "): all " + std::to_string(layout_.max_producers) +
                        " producer entries are held by live producers; create the ring with a larger "
                        "max_producers, or close producers that are done");
}

void SlotRing::activate_entry(uint32_t index, sync::LivenessLock lock) {
  ProducerEntry& entry = producer_entry(index);
  // The mark only grows; reapers scan entries below it.
  uint32_t mark = producers_claimed();
  // acq_rel: a reaper that sees the new mark also sees the entries below it.
  while (mark <= index && !control().producers_claimed.compare_exchange(mark, index + 1, std::memory_order_acq_rel)) {
  }
  // The entry is ours: nobody alive holds its lock. Whatever it says, its
  // previous producer is gone; a new generation makes a reaper that judged
  // that one lost (and still holds its old word) fail its compare-exchange.
  // acquire: pairs with the previous holder's (or a reaper's) release.
  uint64_t raw = entry.state.load(std::memory_order_acquire);
  ProducerWord previous;
  uint64_t generation = 0;
  do {
    TENSORXFER_CHECK(CorruptSegment, ProducerWord::decode(raw, previous), "SlotRing '", name(),
                     "': producer entry ", index, " has an invalid state word 0x", std::hex, raw);
    generation = (previous.generation + 1) & kGenerationMask;
    // acq_rel: orders our entry writes below after the claim, and sees the old holder's writes.
  } while (!entry.state.compare_exchange(raw, ProducerWord{kProducerAttaching, generation}.encode(),
                                         std::memory_order_acq_rel));
  producer_index_ = index;
  producer_generation_ = generation;
  producer_lock_ = std::move(lock);
  failpoint("slot_ring.attach.claimed");
  // The previous holder's slots and sequence claim, if nobody reaped them yet.
  if (free_writes_of(index, std::nullopt, generation)) control().free_event.notify_all();
  entry.claim.store(0, std::memory_order_seq_cst);  // seq_cst: see claim_sequence()
  entry.identity = sync::current_process_identity();  // diagnostics
  // release: whoever reads Active also reads the entry as written above.
  entry.state.store(ProducerWord{kProducerActive, generation}.encode(), std::memory_order_release);
}

bool SlotRing::free_writes_of(uint32_t index, std::optional<uint64_t> generation, uint64_t keep) noexcept {
  bool freed = false;
  for (uint32_t slot = 0; slot < layout_.depth; ++slot) {
    // relaxed: a candidate; the compare-exchange decides.
    const uint64_t raw = slot_entry(slot).state.load(std::memory_order_relaxed);
    SlotWord word;
    if (!SlotWord::decode(raw, word) || word.state != SlotState::kWriting || word.producer != index) continue;
    if (generation ? word.sequence != *generation : word.sequence == keep) continue;
    uint64_t expected = raw;
    // release: like release(); the next writer's acquire pairs with it.
    if (slot_entry(slot).state.compare_exchange(expected, SlotWord{SlotState::kFree, 0, 0}.encode(),
                                                std::memory_order_release)) {
      freed = true;
    }
  }
  return freed;
}

uint32_t SlotRing::live_producers() const {
  uint32_t live = 0;
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    if (producer_live(index, load_producer_word(index))) ++live;
  }
  return live;
}

void SlotRing::reap_dead_producers() {
  bool freed = false;
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    ProducerEntry& entry = producer_entry(index);
    ProducerWord word = load_producer_word(index);
    if (word.state == kProducerAttaching || word.state == kProducerActive) {
      if (producer_live(index, word)) continue;
      // Attaching/Active with the lock free: that producer is gone (it takes the
      // lock before writing the word, and writes Detached before letting it go).
      uint64_t expected = word.encode();
      const ProducerWord dead{kProducerDead, word.generation};
      // acq_rel: exactly one reaper marks it; a new holder's claim (a new
      // generation) makes this fail, and then the entry is not ours to reap.
      if (!entry.state.compare_exchange(expected, dead.encode(), std::memory_order_acq_rel)) continue;
      word = dead;
    }
    if (word.state != kProducerDead) continue;
    freed = free_writes_of(index, word.generation) || freed;
  }
  if (freed) control().free_event.notify_all();
}

bool SlotRing::sequence_claimed_by_live_producer(uint64_t sequence) const {
  const uint32_t claimed = producers_claimed();
  for (uint32_t index = 0; index < claimed; ++index) {
    const ProducerEntry& entry = producer_entry(index);
    // seq_cst: see claim_sequence(); the claim is announced before the counter moves.
    if (entry.claim.load(std::memory_order_seq_cst) != sequence + 1) continue;
    if (producer_live(index, load_producer_word(index))) return true;
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
    const ProducerWord word = load_producer_word(index);
    if (producer_live(index, word)) {
      ++live;
    } else if (producer_lost(index, word)) {
      ++dead;
    }
  }
  TENSORXFER_CHECK(PeerLost, live > 0 || dead == 0, "SlotRing '", name(), "': every producer that attached ",
                   "has exited or closed (", dead, " died without closing), and no slot is ready");
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
    // The consumer holds the segment creator's liveness lock until it closes.
    if (!segment_.owner_alive()) {
      segment_.unlink();  // its creator is gone: nobody else will remove the name
      throw PeerLost("SlotRing '" + name() + "': the consumer (" + consumer_identity_.describe() +
                     " in its PID namespace) has exited");
    }
  }
  reap_dead_producers();
}

}  // namespace tensorxfer::ipc
