// SlotRing: construction, the producer and consumer operations, close.
// Peer liveness (reaping dead producers, skipping abandoned sequences) is in
// slot_ring_peers.cc.
#include "tensorxfer/ipc/slot_ring.h"

#include <unistd.h>

#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/common/process_id.h"

namespace tensorxfer::ipc {
namespace {

sync::WaitClock::time_point deadline_after(const char* operation, std::chrono::nanoseconds timeout) {
  TENSORXFER_CHECK(InvalidArgument, timeout.count() >= 0, operation, ": timeout must be >= 0, got ",
                   timeout.count(), " ns");
  const auto now = sync::WaitClock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::nanoseconds>(sync::WaitClock::time_point::max() - now)) {
    return sync::WaitClock::time_point::max();
  }
  return now + std::chrono::duration_cast<sync::WaitClock::duration>(timeout);
}

std::string seconds_text(std::chrono::nanoseconds timeout) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(3);
  text << std::chrono::duration<double>(timeout).count() << " s";
  return text.str();
}

uint64_t monotonic_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(sync::WaitClock::now().time_since_epoch()).count());
}

}  // namespace

// ---- construction ------------------------------------------------------------------

SlotRing::SlotRing(memory::ShmSegment segment, const RingLayout& layout, bool consumer, sync::SpinPolicy spin)
    : segment_(std::move(segment)),
      layout_(layout),
      payload_(segment_.payload()),
      consumer_(consumer),
      user_pid_(static_cast<int32_t>(current_process_id())),
      consumer_identity_(segment_.owner()),
      spin_(spin) {}

std::unique_ptr<SlotRing> SlotRing::create(uint32_t depth, std::size_t slot_nbytes, sync::SpinPolicy spin,
                                           uint32_t max_producers) {
  const RingLayout layout = RingLayout::compute(depth, slot_nbytes, max_producers, false);
  memory::ShmSegment segment = memory::ShmSegment::create(layout.total_nbytes, kSlotRingKind);
  std::byte* payload = segment.payload();
  const RingHeader header = layout.make_header();
  std::memcpy(payload, &header, sizeof(header));
  std::unique_ptr<SlotRing> ring(new SlotRing(std::move(segment), layout, true, spin));
  for (uint32_t slot = 0; slot < depth; ++slot) {
    // relaxed: nobody else can see the segment before create() returns its name.
    ring->slot_entry(slot).state.store(SlotWord{SlotState::kFree, 0, 0}.encode(), std::memory_order_relaxed);
    ring->order_cell(slot).store(~uint64_t{0}, std::memory_order_relaxed);
  }
  // release: a producer that reads kConsumerOpen sees the initialised slots.
  ring->control().consumer_state.store(kConsumerOpen, std::memory_order_release);
  return ring;
}

std::unique_ptr<SlotRing> SlotRing::attach(const std::string& name, sync::SpinPolicy spin) {
  memory::ShmSegment segment = memory::ShmSegment::attach(name, kSlotRingKind);
  const std::string context = "SlotRing::attach(" + segment.name() + ")";
  TENSORXFER_CHECK(CorruptSegment, segment.payload_nbytes() >= kRingControlOffset + sizeof(RingControl), context,
                   ": payload of ", segment.payload_nbytes(), " bytes is too small for a ring header");
  RingHeader header;
  std::memcpy(&header, segment.payload(), sizeof(header));
  const RingLayout layout = RingLayout::from_header(header, segment.payload_nbytes(), context);
  std::unique_ptr<SlotRing> ring(new SlotRing(std::move(segment), layout, false, spin));
  // acquire: pairs with create()'s release of kConsumerOpen (initialised slots).
  const uint32_t consumer_state = ring->control().consumer_state.load(std::memory_order_acquire);
  if (consumer_state == kConsumerClosed) throw PeerLost(context + ": the consumer has closed the ring");
  TENSORXFER_CHECK(CorruptSegment, consumer_state == kConsumerOpen, context, ": consumer state ",
                   consumer_state, " is not a known state");
  ring->register_producer();
  return ring;
}

SlotRing::~SlotRing() { close(); }

// ---- accessors -------------------------------------------------------------------

RingControl& SlotRing::control() const noexcept { return *reinterpret_cast<RingControl*>(payload_ + kRingControlOffset); }

ProducerEntry& SlotRing::producer_entry(uint32_t index) const noexcept {
  return reinterpret_cast<ProducerEntry*>(payload_ + layout_.producers_offset)[index];
}

SlotEntry& SlotRing::slot_entry(uint32_t slot) const noexcept {
  return reinterpret_cast<SlotEntry*>(payload_ + layout_.slot_entries_offset)[slot];
}

sync::SharedWord64& SlotRing::order_cell(uint64_t sequence) const noexcept {
  return reinterpret_cast<sync::SharedWord64*>(payload_ + layout_.order_offset)[sequence % layout_.depth];
}

SlotWord SlotRing::load_slot_word(uint32_t slot, std::memory_order order) const {
  const uint64_t raw = slot_entry(slot).state.load(order);
  SlotWord word;
  TENSORXFER_CHECK(CorruptSegment, SlotWord::decode(raw, word), "SlotRing '", name(), "': slot ", slot,
                   " has an invalid state word 0x", std::hex, raw);
  TENSORXFER_CHECK(CorruptSegment, word.state == SlotState::kFree || word.state == SlotState::kReading ||
                                       word.producer < layout_.max_producers,
                   "SlotRing '", name(), "': slot ", slot, " names producer ", word.producer, ", expected < ",
                   layout_.max_producers);
  return word;
}

std::byte* SlotRing::slot_data(uint32_t slot) const {
  check_slot("SlotRing::slot_data", slot);
  return payload_ + layout_.slots_offset + uint64_t{slot} * layout_.slot_stride;
}

void SlotRing::check_open(const char* operation) const {
  TENSORXFER_CHECK(Closed, !closed_.load(std::memory_order_relaxed), operation, ": ring is closed");
}

void SlotRing::check_usable(const char* operation) const {
  check_open(operation);
  // Public entry points check the process once (a cached getpid(): process_id.h); inner loops do not.
  TENSORXFER_CHECK(InvalidArgument, current_process_id() == user_pid_, operation, ": this SlotRing belongs to pid ",
                   user_pid_, "; a fork()ed child must attach again by name");
}

void SlotRing::check_slot(const char* operation, uint32_t slot) const {
  TENSORXFER_CHECK(InvalidArgument, slot < layout_.depth, operation, ": slot must be in [0, ", layout_.depth,
                   "), got ", slot);
}

// ---- producer --------------------------------------------------------------------

std::optional<uint32_t> SlotRing::try_acquire_free() {
  check_usable("SlotRing::acquire_free");
  std::lock_guard<std::mutex> lock(mutex_);
  return take_free_locked();
}

std::optional<uint32_t> SlotRing::take_free_locked() {
  check_open("SlotRing::acquire_free");
  if (!producer_index_) register_producer();  // the consumer producing into its own ring
  const uint64_t writing = my_writing_word().encode();
  for (uint32_t i = 0; i < layout_.depth; ++i) {
    const uint32_t slot = (next_free_hint_ + i) % layout_.depth;
    // relaxed: only a candidate; the compare-exchange below decides.
    const SlotWord word = load_slot_word(slot, std::memory_order_relaxed);
    if (word.state != SlotState::kFree) continue;
    uint64_t expected = word.encode();
    // acquire: pairs with the release that freed the slot, so the consumer's
    // reads of its bytes finish before we overwrite them.
    if (slot_entry(slot).state.compare_exchange(expected, writing, std::memory_order_acquire)) {
      next_free_hint_ = (slot + 1) % layout_.depth;
      return slot;
    }
  }
  return std::nullopt;
}

uint32_t SlotRing::acquire_free(std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  const auto deadline = deadline_after("SlotRing::acquire_free", timeout);
  check_usable("SlotRing::acquire_free");
  std::optional<uint32_t> slot;
  const auto status = control().free_event.await(
      [&] {
        std::lock_guard<std::mutex> lock(mutex_);
        return (slot = take_free_locked()).has_value();
      },
      deadline, spin_, [&] {
        if (hook) hook();
        watch_as_producer();
      });
  if (status == sync::WaitStatus::kReady) return *slot;
  throw Timeout("SlotRing::acquire_free: no slot became free within " + seconds_text(timeout) + " (ring '" +
                name() + "', depth " + std::to_string(layout_.depth) + ")");
}

uint64_t SlotRing::claim_sequence() {
  ProducerEntry& entry = producer_entry(*producer_index_);
  // seq_cst (counter and claim): a consumer that sees the counter past a
  // sequence must also see the claim announced before taking it.
  uint64_t sequence = control().publish_counter.load(std::memory_order_seq_cst);
  for (;;) {
    entry.claim.store(sequence + 1, std::memory_order_seq_cst);
    if (control().publish_counter.compare_exchange(sequence, sequence + 1, std::memory_order_seq_cst)) {
      return sequence;
    }
  }
}

void SlotRing::publish(uint32_t slot, uint64_t tick_id) {
  check_usable("SlotRing::publish");
  check_slot("SlotRing::publish", slot);
  std::lock_guard<std::mutex> lock(mutex_);
  check_open("SlotRing::publish");
  // relaxed: our own WRITING mark, which only we (or a reaper, if we were dead) change.
  const SlotWord word = load_slot_word(slot, std::memory_order_relaxed);
  TENSORXFER_CHECK(InvalidArgument, held_by_me(word), "SlotRing::publish: slot ", slot,
                   " is not held by this producer for writing (state ", word.describe(),
                   "); publish only slots from acquire_free, once");
  SlotEntry& entry = slot_entry(slot);
  // relaxed: made visible by the release compare-exchange to READY below.
  entry.tick_id.store(tick_id, std::memory_order_relaxed);
  entry.publish_ns.store(monotonic_ns(), std::memory_order_relaxed);
  const uint64_t sequence = claim_sequence();
  // relaxed: a hint; the consumer re-checks the slot's own state word.
  order_cell(sequence).store(encode_order_cell(sequence, slot), std::memory_order_relaxed);
  uint64_t expected = word.encode();
  // release: the slot's bytes, tick id and publish time happen-before the
  // consumer's acquire of READY.
  const bool published = entry.state.compare_exchange(
      expected, SlotWord{SlotState::kReady, *producer_index_, sequence}.encode(), std::memory_order_release);
  // seq_cst: after the READY store, so a consumer that sees the claim cleared
  // also sees READY (or knows the sequence was abandoned).
  producer_entry(*producer_index_).claim.store(0, std::memory_order_seq_cst);
  control().ready_event.notify_all();
  TENSORXFER_CHECK(CorruptSegment, published, "SlotRing::publish: slot ", slot,
                   " changed state while held for writing (now 0x", std::hex, expected, ")");
}

void SlotRing::abandon(uint32_t slot) {
  check_usable("SlotRing::abandon");
  check_slot("SlotRing::abandon", slot);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_open("SlotRing::abandon");
    // relaxed: our own WRITING mark, as in publish().
    const SlotWord word = load_slot_word(slot, std::memory_order_relaxed);
    TENSORXFER_CHECK(InvalidArgument, held_by_me(word), "SlotRing::abandon: slot ", slot,
                     " is not held by this producer for writing (state ", word.describe(),
                     "); abandon only slots from acquire_free that were not published");
    uint64_t expected = word.encode();
    // release: like release(); our writes to the slot happen-before the next writer's.
    TENSORXFER_CHECK(CorruptSegment,
                     slot_entry(slot).state.compare_exchange(expected, SlotWord{SlotState::kFree, 0, 0}.encode(),
                                                             std::memory_order_release),
                     "SlotRing::abandon: slot ", slot, " changed state while held for writing (now 0x", std::hex,
                     expected, ")");
  }
  control().free_event.notify_all();
}

SlotWord SlotRing::my_writing_word() const noexcept {
  return SlotWord{SlotState::kWriting, *producer_index_, producer_generation_};
}

bool SlotRing::held_by_me(const SlotWord& word) const noexcept {
  return producer_index_ && word.state == SlotState::kWriting && word.producer == *producer_index_ &&
         word.sequence == producer_generation_;
}

// ---- consumer --------------------------------------------------------------------

void SlotRing::check_consumer(const char* operation) const {
  check_usable(operation);
  TENSORXFER_CHECK(InvalidArgument, consumer_, operation, ": only the ring's creator consumes; ",
                   "this handle attached as a producer");
}

void SlotRing::report_peer_lost(std::string message) {
  check_consumer("SlotRing::report_peer_lost");
  {
    std::lock_guard<std::mutex> lock(reports_mutex_);
    reported_losses_.push_back(std::move(message));
    loss_reported_.store(true, std::memory_order_relaxed);
  }
  control().ready_event.notify_all();  // a consumer waiting now reports it at once
}

std::optional<std::string> SlotRing::take_reported_loss() {
  if (!loss_reported_.load(std::memory_order_relaxed)) return std::nullopt;
  std::lock_guard<std::mutex> lock(reports_mutex_);
  if (reported_losses_.empty()) return std::nullopt;
  std::string message = std::move(reported_losses_.front());
  reported_losses_.pop_front();
  loss_reported_.store(!reported_losses_.empty(), std::memory_order_relaxed);
  return message;
}

std::optional<ReadySlot> SlotRing::try_acquire_ready() {
  check_consumer("SlotRing::acquire_ready");
  if (auto loss = take_reported_loss()) throw PeerLost(*loss);
  std::lock_guard<std::mutex> lock(mutex_);
  return take_next_locked();
}

ReadySlot SlotRing::acquire_ready(std::chrono::nanoseconds timeout, const sync::WaitHook& hook) {
  const auto deadline = deadline_after("SlotRing::acquire_ready", timeout);
  check_consumer("SlotRing::acquire_ready");
  std::optional<ReadySlot> ready;
  std::optional<std::string> loss;
  const auto status = control().ready_event.await(
      [&] {
        if ((loss = take_reported_loss())) return true;
        std::lock_guard<std::mutex> lock(mutex_);
        return (ready = take_next_locked()).has_value();
      },
      deadline, spin_,
      [&] {
        if (hook) hook();
        watch_as_consumer();
      });
  if (loss) throw PeerLost(*loss);
  if (status == sync::WaitStatus::kReady) return *ready;
  throw Timeout("SlotRing::acquire_ready: nothing was published within " + seconds_text(timeout) +
                " (ring '" + name() + "', " + std::to_string(live_producers()) + " live producers)");
}

std::optional<uint32_t> SlotRing::find_ready_locked(uint64_t sequence) const {
  const uint64_t wanted = sequence & kSequenceMask;
  // acquire: pairs with nothing in particular (a hint); the state word decides.
  const uint64_t cell = order_cell(sequence).load(std::memory_order_acquire);
  const auto hinted = static_cast<uint32_t>(cell & 0xFFFF);
  if ((cell >> 16) == wanted && hinted < layout_.depth) {
    // acquire: pairs with publish()'s release, making the slot's bytes visible.
    const SlotWord word = load_slot_word(hinted, std::memory_order_acquire);
    if (word.state == SlotState::kReady && word.sequence == wanted) return hinted;
  }
  for (uint32_t slot = 0; slot < layout_.depth; ++slot) {
    const SlotWord word = load_slot_word(slot, std::memory_order_acquire);  // acquire: as above
    if (word.state == SlotState::kReady && word.sequence == wanted) return slot;
  }
  return std::nullopt;
}

std::optional<ReadySlot> SlotRing::take_next_locked() {
  check_open("SlotRing::acquire_ready");
  const uint64_t sequence = next_sequence_;
  // acquire: orders the slot scan after observing the counter.
  const uint64_t published = control().publish_counter.load(std::memory_order_acquire);
  if (published == sequence) return std::nullopt;
  // Outstanding sequences are bounded by the READY slots plus one in flight
  // per producer; anything else is a corrupt (or hostile) counter.
  TENSORXFER_CHECK(CorruptSegment,
                   published > sequence && published - sequence <= uint64_t{layout_.depth} + layout_.max_producers,
                   "SlotRing '", name(), "': publish counter ", published, " is inconsistent with the next sequence ",
                   sequence, " (depth ", layout_.depth, ", max_producers ", layout_.max_producers, ")");
  const std::optional<uint32_t> slot = find_ready_locked(sequence);
  if (!slot) return std::nullopt;
  SlotEntry& entry = slot_entry(*slot);
  const SlotWord ready = load_slot_word(*slot, std::memory_order_acquire);  // acquire: as in find_ready_locked
  uint64_t expected = ready.encode();
  // acquire: the READY store was a release; only the consumer moves READY slots.
  TENSORXFER_CHECK(CorruptSegment,
                   ready.state == SlotState::kReady &&
                       entry.state.compare_exchange(expected, SlotWord{SlotState::kReading, 0, ready.sequence}.encode(),
                                                    std::memory_order_acquire),
                   "SlotRing '", name(), "': slot ", *slot, " left READY while the consumer took it");
  ReadySlot result;
  result.slot = *slot;
  // relaxed: ordered by the acquire above.
  result.tick_id = entry.tick_id.load(std::memory_order_relaxed);
  result.publish_ns = entry.publish_ns.load(std::memory_order_relaxed);
  last_publish_ns_ = result.publish_ns;
  next_sequence_ = sequence + 1;
  return result;
}

void SlotRing::release(uint32_t slot) {
  {
    check_consumer("SlotRing::release");
    check_slot("SlotRing::release", slot);
    std::lock_guard<std::mutex> lock(mutex_);
    const SlotWord word = load_slot_word(slot, std::memory_order_relaxed);  // relaxed: our own READING mark
    TENSORXFER_CHECK(InvalidArgument, word.state == SlotState::kReading, "SlotRing::release: slot ", slot,
                     " is not held by the consumer (state ", word.describe(),
                     "); release only slots from acquire_ready, once");
    uint64_t expected = word.encode();
    // release: our reads of the slot's bytes happen-before the next producer's writes.
    TENSORXFER_CHECK(CorruptSegment,
                     slot_entry(slot).state.compare_exchange(expected, SlotWord{SlotState::kFree, 0, 0}.encode(),
                                                             std::memory_order_release),
                     "SlotRing::release: slot ", slot, " changed state while held by the consumer");
  }
  control().free_event.notify_all();
}

// ---- close -----------------------------------------------------------------------

void SlotRing::close() noexcept {
  // A fork()ed child's copy is not ours to close, and another thread of the
  // parent may have held mutex_ when the child was forked: decide before locking.
  if (current_process_id() != user_pid_) {
    closed_.store(true, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_.exchange(true, std::memory_order_relaxed)) return;
  if (producer_index_) {
    const uint32_t index = *producer_index_;
    ProducerEntry& entry = producer_entry(index);
    (void)free_writes_of(index, producer_generation_);
    entry.claim.store(0, std::memory_order_seq_cst);  // seq_cst: see publish()
    // release: our slot hand-backs happen-before anyone who sees us detached.
    // Detached before the lock goes: a reaper never sees us Active and unlocked.
    entry.state.store(ProducerWord{kProducerDetached, producer_generation_}.encode(), std::memory_order_release);
    producer_lock_.release();
  }
  if (consumer_) {
    // release: producers that see the ring closed stop waiting for it.
    control().consumer_state.store(kConsumerClosed, std::memory_order_release);
  }
  control().free_event.notify_all();
  control().ready_event.notify_all();
  segment_.detach();
}

}  // namespace tensorxfer::ipc
