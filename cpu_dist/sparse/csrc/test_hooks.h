// Test-only pause points of one shard: a test arms a point, the next thread that reaches it
// holds there until the test releases it, so an interleaving that is otherwise a matter of luck
// (a commit applied while a pull gathers, a call served while a Save holds the table) happens
// every time.  A server has hooks only when built with ServerOptions::test_hooks (set by Python
// tests alone); without them every point is one null-pointer test.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace cpu_dist::ps {

enum class TestPoint : size_t {
  kPullBetweenStripes,  // a pull's gather, after its first stripe, no lock held
  kSaveFrozen,          // a Save, with the table frozen (updates wait), before it writes
  kDecodeReserved,      // a compressed request, its decoded bytes reserved, before decoding
  kStepLocked,          // a committed step's apply, its tables' step locks taken, no row changed
  kDeferredRetry,       // a Push or Commit that met a lock, on the thread that may wait, before
                        // it runs again from its request
};
// The names a test gives the points, in TestPoint's order: the one list of them.
inline constexpr std::array<std::string_view, 5> kTestPointNames = {
    "pull_between_stripes", "save_frozen", "decode_reserved", "step_locked", "retry_deferred"};
inline constexpr size_t kNumTestPoints = kTestPointNames.size();

// The point a test names, if any.
inline std::optional<TestPoint> test_point_of(std::string_view name) {
  for (size_t i = 0; i < kNumTestPoints; ++i)
    if (kTestPointNames[i] == name) return static_cast<TestPoint>(i);
  return std::nullopt;
}

// "pull_between_stripes, save_frozen, ...": for the message refusing an unknown name.
inline std::string test_point_list() {
  std::string out;
  for (std::string_view n : kTestPointNames) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

class TestHooks {
 public:
  // A thread holds at a point at most this long (no test can hang a shard forever).
  static constexpr std::chrono::seconds kMaxHold{60};

  // The next thread that reaches `p` holds there until release(p).
  void arm(TestPoint p) {
    std::lock_guard<std::mutex> lock(mu_);
    State& s = at(p);
    s.armed = true;
    s.released = false;
  }
  // True once a thread holds at `p` (within timeout_s).
  bool wait_held(TestPoint p, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                        [&] { return at(p).holding; });
  }
  // Lets the thread at `p` go on (or disarms `p` if none reached it yet).
  void release(TestPoint p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      State& s = at(p);
      s.armed = false;
      s.released = true;
    }
    cv_.notify_all();
  }
  // Test-only fault: every write of something to the SSD tier fails (TierError) while set.
  void fail_ssd_writes(bool on) { ssd_writes_fail_.store(on); }
  bool ssd_writes_fail() const { return ssd_writes_fail_.load(); }

  // Called at the point itself.
  void reach(TestPoint p) {
    std::unique_lock<std::mutex> lock(mu_);
    State& s = at(p);
    if (!s.armed) return;
    s.armed = false;
    s.holding = true;
    cv_.notify_all();
    cv_.wait_for(lock, kMaxHold, [&] { return s.released; });
    s.holding = false;
    s.released = false;
  }

 private:
  struct State {
    bool armed = false, holding = false, released = false;
  };
  State& at(TestPoint p) { return states_[static_cast<size_t>(p)]; }

  std::mutex mu_;
  std::condition_variable cv_;
  std::array<State, kNumTestPoints> states_{};
  std::atomic<bool> ssd_writes_fail_{false};
};

}  // namespace cpu_dist::ps
