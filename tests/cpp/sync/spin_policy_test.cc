// The adaptive wait policy's decisions, on recorded (synthetic) arrival times:
// no clocks, no threads except in the last test.
#include "tensorxfer/sync/spin_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "tensorxfer/common/error.h"

namespace tensorxfer::sync {
namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using Kind = WaitPlan::Kind;

constexpr WaitTime kEpoch{std::chrono::seconds(1000)};

// Replays waits: each starts `gap` after the previous arrival was seen and
// lasts `waits[i]`; seen at once (a spinning waiter), without a timestamp.
// Returns the time the last arrival was seen.
WaitTime replay_waits(WaitPredictor& predictor, const std::vector<nanoseconds>& waits, nanoseconds gap = 20us,
                      WaitTime at = kEpoch) {
  for (const nanoseconds wait : waits) {
    const WaitTime start = at + gap;
    at = start + wait;
    predictor.record_arrival(start, at, std::nullopt, false);
  }
  return at;
}

std::vector<nanoseconds> repeated(nanoseconds wait, std::size_t count) {
  return std::vector<nanoseconds>(count, wait);
}

// `count` waits evenly spaced over [low, high], in a scrambled order.
std::vector<nanoseconds> evenly(nanoseconds low, nanoseconds high, std::size_t count) {
  std::vector<nanoseconds> waits;
  for (std::size_t i = 0; i < count; ++i) waits.push_back(low + (high - low) * static_cast<int64_t>(i) / static_cast<int64_t>(count - 1));
  std::shuffle(waits.begin(), waits.end(), std::mt19937(7));
  return waits;
}

// The window the predictor documents: the central 7/8 of recent samples.
struct Central {
  nanoseconds low, median, high;
};
Central central(std::vector<nanoseconds> samples) {
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return {samples[n / 16], samples[n / 2], samples[n - 1 - n / 16]};
}

constexpr std::size_t kFull = WaitPredictor::kHistory;

// Waits uniformly spread over [low, high].
std::vector<nanoseconds> spread_waits(nanoseconds low, nanoseconds high, int count, unsigned seed = 1) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int64_t> pick(low.count(), high.count());
  std::vector<nanoseconds> waits;
  for (int i = 0; i < count; ++i) waits.emplace_back(pick(random));
  return waits;
}

TEST(SpinPolicyTest, FixedBudgetsAreValidated) {
  EXPECT_EQ(SpinPolicy::fixed(0us).budget(), 0ns);
  EXPECT_EQ(SpinPolicy::fixed(75us).budget(), 75us);
  EXPECT_EQ(SpinPolicy::fixed(75us).fixed_budget(), 75us);
  EXPECT_FALSE(SpinPolicy::adaptive().fixed_budget().has_value());
  EXPECT_THROW(SpinPolicy::fixed(-1us), InvalidArgument);
  EXPECT_THROW(SpinPolicy::fixed(SpinPolicy::kFixedMax + 1us), InvalidArgument);
}

TEST(SpinPolicyTest, FixedPlansIgnoreEverythingRecorded) {
  for (const auto budget : {0us, 30us}) {
    SpinPolicy fixed = SpinPolicy::fixed(budget);
    for (int i = 0; i < 32; ++i) {
      const WaitTime start = kEpoch + i * 500us;
      fixed.record_arrival(start, start + 480us, start + 470us, true);
    }
    fixed.record_timeout();
    fixed.record_timed_wake(kEpoch, kEpoch + 100us);
    const WaitPlan plan = fixed.plan(kEpoch + 1s);
    EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
    EXPECT_EQ(plan.spin, budget);
    EXPECT_EQ(plan.wake_at, kEpoch + 1s);
    EXPECT_EQ(plan.window_end, kEpoch + 1s);
    EXPECT_FALSE(fixed.predictor().wait_spread().has_value());  // nothing was learned
  }
}

TEST(SpinPolicyTest, AdaptiveStartsWithTheInitialSpin) {
  const SpinPolicy spin = SpinPolicy::adaptive();
  EXPECT_EQ(spin.budget(), SpinPolicy::kAdaptiveInitial);
  const WaitPlan plan = spin.plan(kEpoch);
  EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
  WaitPredictor predictor;
  replay_waits(predictor, repeated(480us, WaitPredictor::kMinSamples - 1));
  EXPECT_EQ(predictor.plan(kEpoch + 1s).spin, WaitPredictor::kAdaptiveInitial);  // not enough samples yet
}

TEST(SpinPolicyTest, ShortWaitsSpinTwiceTheHighPercentile) {
  WaitPredictor predictor;
  replay_waits(predictor, repeated(30us, kFull));
  WaitPlan plan = predictor.plan(kEpoch + 1s);
  EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
  EXPECT_EQ(plan.spin, 60us);
  replay_waits(predictor, repeated(1us, kFull));
  EXPECT_EQ(predictor.plan(kEpoch + 1s).spin, WaitPredictor::kAdaptiveMinSpin);
  replay_waits(predictor, repeated(150us, kFull));
  EXPECT_EQ(predictor.plan(kEpoch + 1s).spin, WaitPredictor::kAdaptiveMax);
}

TEST(SpinPolicyTest, RegularLongWaitsSleepUntilJustBeforeThePredictedArrival) {
  WaitPredictor predictor;
  const std::vector<nanoseconds> waits = evenly(475us, 485us, kFull);
  const WaitTime last = replay_waits(predictor, waits);
  predictor.record_immediate(last, std::nullopt);  // no period to go by: the wait length only
  const WaitTime start = last + 20us;
  const WaitPlan plan = predictor.plan(start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.spin, WaitPredictor::kAdaptiveFloor);
  const Central expected = central(waits);
  // Awake a margin plus the expected timer lateness before the earliest expected arrival...
  EXPECT_EQ(plan.wake_at, start + expected.low - WaitPredictor::kWindowMargin - WaitPredictor::kInitialWakeLateness);
  // ...spinning until a margin after the latest.
  EXPECT_EQ(plan.window_end, start + expected.high + WaitPredictor::kWindowMargin);
  EXPECT_EQ(plan.predicted_arrival, start + expected.median);
  // The CPU bound: the spin window is at most a quarter of the wait.
  EXPECT_LE(plan.window_end - plan.wake_at, 480us / 4);
}

TEST(SpinPolicyTest, IrregularWaitsAreNotSpunFor) {
  WaitPredictor predictor;
  WaitTime last = replay_waits(predictor, spread_waits(300us, 3ms, kFull));
  WaitPlan plan = predictor.plan(last + 20us);
  EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
  EXPECT_EQ(plan.spin, WaitPredictor::kAdaptiveFloor);
  // Waits mostly short but with a long tail: spin for the short ones only.
  predictor = WaitPredictor{};
  std::vector<nanoseconds> mixed = repeated(50us, 20);
  for (const auto wait : spread_waits(400us, 5ms, 12)) mixed.push_back(wait);
  last = replay_waits(predictor, mixed);
  plan = predictor.plan(last + 20us);
  EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
  EXPECT_EQ(plan.spin, WaitPredictor::kAdaptiveMax);
}

TEST(SpinPolicyTest, AWideSpreadIsCutToTheDensestStretchThatFitsTheCap) {
  WaitPredictor predictor;
  // Most waits within 470..490 us, but eight stray ones far out on both sides:
  // the central 7/8 span 340..640 us, more than the 120 us cap allows.
  std::vector<nanoseconds> waits = evenly(470us, 490us, 24);
  for (const auto stray : {300us, 320us, 340us, 360us, 620us, 640us, 660us, 680us}) waits.push_back(stray);
  const WaitTime last = replay_waits(predictor, waits);
  predictor.record_immediate(last, std::nullopt);
  const WaitTime start = last + 20us;
  const WaitPlan plan = predictor.plan(start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.window_end, start + 490us + WaitPredictor::kWindowMargin);
  EXPECT_EQ(plan.wake_at, start + 470us - WaitPredictor::kWindowMargin - WaitPredictor::kInitialWakeLateness);
}

TEST(SpinPolicyTest, ArrivalsSpreadWiderThanTheCapAreNotSpunFor) {
  WaitPredictor predictor;
  // Uniform over 200..800 us: the best 105 us stretch holds ~1/6 of them.
  WaitTime last = replay_waits(predictor, evenly(200us, 800us, kFull));
  EXPECT_EQ(predictor.plan(last + 20us).kind, Kind::kSpinThenSleep);
  EXPECT_EQ(predictor.plan(last + 20us).spin, WaitPredictor::kAdaptiveFloor);
  // 100 ms periods: a quarter would be 25 ms, but spinning is capped at kMaxWindow (1 ms).
  predictor = WaitPredictor{};
  last = replay_waits(predictor, evenly(98ms, 102ms, kFull));
  EXPECT_EQ(predictor.plan(last + 20us).kind, Kind::kSpinThenSleep);
  predictor = WaitPredictor{};
  last = replay_waits(predictor, evenly(99'800us, 100'200us, kFull));
  const WaitPlan plan = predictor.plan(last + 20us);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_LE(plan.window_end - plan.wake_at, WaitPredictor::kMaxWindow + WaitPredictor::kInitialWakeLateness);
}

TEST(SpinPolicyTest, WaitsJustAboveTheSpinCapStillSleepUntilTheWindow) {
  WaitPredictor predictor;
  const WaitTime last = replay_waits(predictor, spread_waits(228us, 232us, kFull));
  const WaitTime start = last + 20us;
  const WaitPlan plan = predictor.plan(start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_GT(plan.wake_at, start + 190us);  // ~230 - 10 - 15 us asleep, then a ~24 us window
  EXPECT_LT(plan.window_end, start + 245us);
}

TEST(SpinPolicyTest, AWaitStartingJustBeforeADueArrivalSpinsFromTheStart) {
  WaitPredictor predictor;
  std::mt19937 random(5);
  std::uniform_int_distribution<int64_t> lead_us(400, 800);
  WaitTime publish = kEpoch;
  for (int i = 0; i < 16; ++i) {
    publish += 1ms;
    predictor.record_arrival(publish - std::chrono::microseconds(lead_us(random)), publish, publish, false);
  }
  const WaitTime start = publish + 980us;  // the next publish is due in 20 us
  const WaitPlan plan = predictor.plan(start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.spin, 0ns);
  EXPECT_EQ(plan.wake_at, start);  // no time to sleep
  EXPECT_EQ(plan.window_end, publish + 1ms + WaitPredictor::kWindowMargin);
}

TEST(SpinPolicyTest, APeriodicPeerIsPredictedFromStampsWhileTheWaiterWorksIrregularly) {
  WaitPredictor predictor;
  std::mt19937 random(3);
  std::uniform_int_distribution<int64_t> work_us(0, 300);
  WaitTime publish = kEpoch;
  WaitTime seen = kEpoch;
  for (int i = 0; i < 16; ++i) {
    publish += 500us;
    const WaitTime start = seen + std::chrono::microseconds(work_us(random));
    seen = publish + 1us;
    predictor.record_arrival(start, seen, publish, false);
  }
  const auto intervals = predictor.interval_spread();
  ASSERT_TRUE(intervals.has_value());
  EXPECT_EQ(intervals->low, 500us);
  EXPECT_EQ(intervals->high, 500us);
  const WaitPlan plan = predictor.plan(seen + 150us);  // a wait after 150 us of work
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.predicted_arrival, publish + 500us);
  EXPECT_EQ(plan.window_end, publish + 500us + WaitPredictor::kWindowMargin);
  EXPECT_EQ(plan.wake_at, publish + 500us - WaitPredictor::kWindowMargin - WaitPredictor::kInitialWakeLateness);
}

TEST(SpinPolicyTest, TwoStraySamplesOnEitherSideChangeNothing) {
  WaitPredictor predictor;
  std::vector<nanoseconds> waits = repeated(480us, kFull - 4);
  waits.insert(waits.begin() + 3, 1s);  // a paused peer
  waits.insert(waits.begin() + 9, 3s);
  waits.insert(waits.begin() + 12, 1us);  // a waiter that started late
  waits.insert(waits.begin() + 20, 2us);
  const WaitTime last = replay_waits(predictor, waits);
  predictor.record_immediate(last, std::nullopt);
  const WaitTime start = last + 20us;
  const WaitPlan plan = predictor.plan(start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.predicted_arrival, start + 480us);
  EXPECT_EQ(plan.window_end, start + 480us + WaitPredictor::kWindowMargin);
}

TEST(SpinPolicyTest, ATimeoutStopsSpinningUntilTheNextArrival) {
  WaitPredictor predictor;
  WaitTime last = replay_waits(predictor, repeated(480us, 16));
  predictor.record_timeout();
  EXPECT_EQ(predictor.plan(last + 1s).kind, Kind::kSpinThenSleep);
  EXPECT_EQ(predictor.plan(last + 1s).spin, WaitPredictor::kAdaptiveFloor);
  last = replay_waits(predictor, repeated(480us, 1), 20us, last + 1s);
  EXPECT_EQ(predictor.plan(last + 20us).kind, Kind::kPredicted);
}

TEST(SpinPolicyTest, TheLatenessOfTimedWakeUpsIsLearned) {
  WaitPredictor predictor;
  const WaitTime last = replay_waits(predictor, repeated(2ms, 16));
  for (std::size_t i = 0; i < kFull; ++i) predictor.record_timed_wake(kEpoch, kEpoch + (i < kFull - 2 ? 40us : 300us));
  EXPECT_EQ(predictor.wake_lateness(), 40us);  // nearly the latest: two late outliers do not count
  const WaitPlan plan = predictor.plan(last + 20us);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.wake_at, last + 20us + 2ms - WaitPredictor::kWindowMargin - 40us);
}

TEST(SpinPolicyTest, ArrivalsSeenOnlyAfterANotifyAreDatedBackByTheNotifyLatency) {
  // Without stamps: a waiter that slept through each arrival saw it ~50 us
  // late; the predictor assumes the typical notify latency and so predicts
  // the true arrival time (which the window then catches while spinning).
  WaitPredictor predictor;
  WaitTime at = kEpoch;
  for (int i = 0; i < 16; ++i) {
    const WaitTime start = at + 20us;
    at = start + 480us + WaitPredictor::kInitialNotifyLatency;  // arrival + wake-up latency
    predictor.record_arrival(start, at, std::nullopt, true);
  }
  EXPECT_EQ(predictor.wait_spread()->median, 480us);
  // With stamps the latency itself is learned.
  for (int i = 0; i < 16; ++i) {
    const WaitTime start = at + 20us;
    predictor.record_arrival(start, start + 500us + 70us, start + 500us, true);
    at = start + 570us;
  }
  EXPECT_EQ(predictor.notify_latency(), 70us);
  EXPECT_EQ(predictor.wait_spread()->median, 500us);
}

TEST(SpinPolicyTest, ImmediateArrivalsKeepThePeriodOnlyWithAStamp) {
  WaitPredictor predictor;
  WaitTime publish = kEpoch;
  for (int i = 0; i < 9; ++i) {  // 8 intervals
    publish += 1ms;
    predictor.record_immediate(publish + 3us, publish);
  }
  ASSERT_TRUE(predictor.interval_spread().has_value());
  EXPECT_EQ(predictor.interval_spread()->median, 1ms);
  EXPECT_FALSE(predictor.wait_spread().has_value());
  WaitPlan plan = predictor.plan(publish + 100us);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.predicted_arrival, publish + 1ms);
  predictor.record_immediate(publish + 1ms, std::nullopt);  // unknown arrival: the chain is broken
  plan = predictor.plan(publish + 1100us);
  EXPECT_EQ(plan.kind, Kind::kSpinThenSleep);
  EXPECT_EQ(plan.spin, WaitPredictor::kAdaptiveInitial);
}

TEST(SpinPolicyTest, ImplausibleStampsAreIgnored) {
  WaitPredictor predictor;
  WaitTime at = kEpoch;
  for (int i = 0; i < 16; ++i) {
    const WaitTime start = at + 20us;
    at = start + 480us;
    // From the future, and from long ago (a corrupt or hostile peer): the waiter's own view counts.
    const WaitTime stamp = i % 2 == 0 ? at + 1s : WaitTime{};
    predictor.record_arrival(start, at, stamp, false);
  }
  EXPECT_EQ(predictor.wait_spread()->median, 480us);
  EXPECT_EQ(predictor.interval_spread()->median, 500us);
}

TEST(SpinPolicyTest, AnOverduePeriodicArrivalFallsBackToTheWaitEstimate) {
  WaitPredictor predictor;
  WaitTime publish = kEpoch;
  WaitTime start = kEpoch;
  for (int i = 0; i < 16; ++i) {
    publish += 500us;
    start = publish - 480us;
    predictor.record_arrival(start, publish, publish, false);
  }
  // Starting long after the next periodic arrival was due: only the wait length helps.
  const WaitTime late_start = publish + 2ms;
  const WaitPlan plan = predictor.plan(late_start);
  ASSERT_EQ(plan.kind, Kind::kPredicted);
  EXPECT_EQ(plan.predicted_arrival, late_start + 480us);
}

TEST(SpinPolicyTest, SpreadsFollowExactlyTheLastSamples) {
  // Checked after every sample (the sorted copy is updated one sample at a
  // time) and after a burst of samples without a look in between.
  WaitPredictor predictor;
  const std::vector<nanoseconds> waits = spread_waits(1us, 5ms, 3 * kFull + 5, 11);
  auto expect_spread_of_last = [&](std::size_t recorded) {
    const std::size_t n = std::min(recorded, kFull);
    std::vector<nanoseconds> last(waits.begin() + static_cast<std::ptrdiff_t>(recorded - n),
                                  waits.begin() + static_cast<std::ptrdiff_t>(recorded));
    std::sort(last.begin(), last.end());
    const auto spread = predictor.wait_spread();
    ASSERT_TRUE(spread.has_value()) << recorded;
    EXPECT_EQ(spread->low, last[n / 8]) << recorded;
    EXPECT_EQ(spread->median, last[n / 2]) << recorded;
    EXPECT_EQ(spread->high, last[n - 1 - n / 8]) << recorded;
  };
  WaitTime at = kEpoch;
  for (std::size_t i = 0; i < waits.size(); ++i) {
    at += 20us;
    predictor.record_arrival(at, at + waits[i], std::nullopt, false);
    at += waits[i];
    if (i + 1 >= WaitPredictor::kMinSamples && i < 2 * kFull) expect_spread_of_last(i + 1);
  }
  expect_spread_of_last(waits.size());
}

TEST(SpinPolicyTest, CopiesCarryWhatWasLearned) {
  SpinPolicy spin = SpinPolicy::adaptive();
  for (int i = 0; i < 16; ++i) {
    const WaitTime start = kEpoch + i * 1ms;
    spin.record_arrival(start, start + 30us, std::nullopt, false);
  }
  const SpinPolicy copy = spin;
  EXPECT_EQ(copy.plan(kEpoch + 1s).spin, 60us);
  SpinPolicy assigned = SpinPolicy::fixed(5us);
  assigned = copy;
  EXPECT_TRUE(assigned.is_adaptive());
  EXPECT_EQ(assigned.plan(kEpoch + 1s).spin, 60us);
  assigned = SpinPolicy::adaptive();  // switching policy forgets
  EXPECT_EQ(assigned.plan(kEpoch + 1s).spin, SpinPolicy::kAdaptiveInitial);
}

TEST(SpinPolicyTest, ThreadsMayShareAPolicy) {
  SpinPolicy spin = SpinPolicy::adaptive();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&spin, t] {
      for (int i = 0; i < 2000; ++i) {
        const WaitTime start = WaitClock::now();
        const WaitPlan plan = spin.plan(start);
        if (plan.window_end < start) std::abort();
        spin.record_arrival(start, start + std::chrono::microseconds(100 * t + i % 7), std::nullopt, i % 3 == 0);
        if (i % 100 == 0) spin.record_timeout();
        if (i % 10 == 0) spin.record_immediate(start, start);
      }
    });
  }
  for (int i = 0; i < 200; ++i) spin = i % 2 ? SpinPolicy::adaptive() : SpinPolicy::fixed(3us);
  for (auto& thread : threads) thread.join();
  EXPECT_GE(spin.budget(), 0ns);
}

}  // namespace
}  // namespace tensorxfer::sync
