// ShardTable: moves between the DRAM and SSD tiers (promotion, CLOCK eviction, expiry drops)
// and the update path that pins rows in DRAM while it changes them.  The byte budget split
// over a shard's tables is in memory_budget.cc.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "table.h"

namespace cpu_dist::ps {

// What commit_step learns from the update for the step rules.
struct ShardTable::StepCtx {
  int64_t step = 0;
  std::vector<std::pair<int64_t, int64_t>> updated;  // admitted keys, last-update step before
  std::vector<int64_t> waiting;                      // keys not admitted
  size_t created = 0;                                // rows the step created
};

uint32_t ShardTable::promote(Slots& s, int64_t key, const char* value) const {
  const uint32_t slot = take_slot(s, key);
  store_->decode_value(value, row_ptr(s, slot), state_ptr(s, slot), step_ptr(s, slot));
  *flags_ptr(s, slot) |= kOnSsd | kRef;  // a clean copy
  ++s.copies;
  return slot;
}

void ShardTable::ssd_write(TierStore::Batch& batch) const {
  if (hooks_ != nullptr && hooks_->ssd_writes_fail() && batch.size() > 0)
    throw TierError("the SSD tier refuses writes (a test's fault)", false);
  store_->write(batch);
}

size_t ShardTable::evict_to(Slots& s, uint64_t target) const {
  if (s.index.size() <= target || s.blocks.empty()) return 0;
  const size_t need = s.index.size() - target;
  // Slots ever used: every slot of the full blocks, the first used_in_last of the last one
  // (the others were never written).
  const auto used = [&s](size_t b) {
    return b + 1 == s.blocks.size() ? s.used_in_last : block_rows(b);
  };
  size_t allocated = 0;
  for (size_t b = 0; b < s.blocks.size(); ++b) allocated += used(b);
  if (s.hand_block >= s.blocks.size() || s.hand_off >= used(s.hand_block))
    s.hand_block = s.hand_off = 0;
  // Second chance: a referenced row loses its bit and is passed over once; two turns of the
  // hand find every unpinned row.
  std::vector<uint32_t> victims;
  TierStore::Batch batch(*store_);
  for (size_t seen = 0; victims.size() < need && seen < 2 * allocated; ++seen) {
    const uint32_t slot = (s.hand_block << 16) | s.hand_off;
    if (++s.hand_off >= used(s.hand_block)) {
      s.hand_off = 0;
      ++s.hand_block;
      if (s.hand_block >= s.blocks.size() || used(s.hand_block) == 0) s.hand_block = 0;
    }
    uint8_t& f = *flags_ptr(s, slot);
    if (!(f & kUsed) || (f & kPinned)) continue;
    if (f & kRef) {
      f &= ~kRef;
      continue;
    }
    f |= kPinned;  // not chosen twice
    victims.push_back(slot);
    if ((f & kDirty) || !(f & kOnSsd))
      batch.put(*key_ptr(s, slot), row_ptr(s, slot), state_ptr(s, slot), *step_ptr(s, slot));
  }
  try {
    ssd_write(batch);  // before the rows leave DRAM: no reader misses them
  } catch (...) {
    for (uint32_t v : victims) *flags_ptr(s, v) &= ~kPinned;
    throw;
  }
  for (uint32_t v : victims) {
    if (*flags_ptr(s, v) & kOnSsd) {
      --s.copies;
    } else {
      ++s.ssd_keys;
    }
    release(s, v);
  }
  return victims.size();
}

size_t ShardTable::drop_rows(const std::vector<int64_t>& keys) {
  std::vector<uint32_t> order, starts;
  group_by_stripe(keys.data(), keys.size(), order, starts);
  size_t dropped = 0;
  std::vector<uint32_t> in_dram;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    in_dram.clear();
    std::unique_ptr<TierStore::Batch> batch;
    if (store_) batch = std::make_unique<TierStore::Batch>(*store_);
    size_t ssd_only = 0, copies = 0;
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      const int64_t key = keys[order[j]];
      auto it = st.s.index.find(key);
      if (it != st.s.index.end()) {
        in_dram.push_back(it->second);
        if (*flags_ptr(st.s, it->second) & kOnSsd) {
          batch->del(key);
          ++copies;
        }
      } else if (store_) {  // an expiring row is held: not in DRAM, it is on SSD
        batch->del(key);
        ++ssd_only;
      }
    }
    if (store_) ssd_write(*batch);
    for (uint32_t slot : in_dram) release(st.s, slot);
    st.s.copies -= copies;
    st.s.ssd_keys -= std::min<uint64_t>(st.s.ssd_keys, copies + ssd_only);
    dropped += in_dram.size() + ssd_only;
  }
  return dropped;
}

void ShardTable::check_budget(const int64_t* keys, size_t n, const std::vector<uint32_t>& order,
                              const std::vector<uint32_t>& starts, const StepCtx* ctx) const {
  // Exact: updates are serial here, and without an SSD tier a pull never inserts.
  uint64_t held = 0, need = 0;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    const Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    held += st.s.index.size();
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      const int64_t key = keys[order[j]];
      if (!st.s.index.contains(key) && (ctx == nullptr || rules_.admits(key))) ++need;
    }
  }
  if (held + need <= tiers_.memory_rows) return;
  throw MemoryFull(absl::StrCat(
      "DRAM tier full: ", ctx != nullptr ? absl::StrCat("step ", ctx->step) : "this push",
      " needs ", need, " new rows beside the ", held, " held (of ", n,
      " keys), over --ps-memory-rows ", tiers_.memory_rows,
      " rows per shard; nothing of it was applied.  Raise --ps-memory-rows or give the shards "
      "an SSD tier with --ps-ssd-dir"));
}

void ShardTable::unpin(const std::vector<uint32_t>& starts, const std::vector<uint32_t>& slots,
                       const std::vector<uint32_t>* fresh) {
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      if (slots[j] == kNoSlot) continue;
      if (fresh != nullptr && (*fresh)[j]) {
        release(st.s, slots[j]);  // a first-touch row reads as an absent one
      } else {
        *flags_ptr(st.s, slots[j]) &= ~kPinned;
      }
    }
  }
}

// An update between its two passes (apply_locked): where its rows are, pinned.
struct ShardTable::Pass {
  const int64_t* keys = nullptr;
  const float* grads = nullptr;
  size_t n = 0;
  float lr = 0.0f;
  OptimizerKind opt = OptimizerKind::kSgd;
  StepCtx* ctx = nullptr;  // null: a push (no step rules)
  std::vector<uint32_t> order, starts;
  std::vector<uint32_t> slots;
  std::vector<uint32_t> fresh;  // rows this update inserted at their first-touch value
  std::vector<uint8_t> ahead_stripe;

  void set(const int64_t* k, const float* g, size_t count, float rate, OptimizerKind o,
           StepCtx* c) {
    keys = k;
    grads = g;
    n = count;
    lr = rate;
    opt = o;
    ctx = c;
  }
};

// A committed step between its passes (prepare_step_locked).
struct ShardTable::PreparedStep {
  StepCtx ctx;
  Pass pass;
};

void ShardTable::PreparedStepDeleter::operator()(PreparedStep* p) const { delete p; }

std::optional<TierError> ShardTable::apply_locked(const int64_t* keys, const float* grads, size_t n,
                                                  float lr, OptimizerKind opt, StepCtx* ctx) {
  Pass p;
  p.set(keys, grads, n, lr, opt, ctx);
  prepare_locked(p, true);
  return finish_locked(p);
}

void ShardTable::prepare_locked(Pass& p, bool write_ahead) {
  const int64_t* keys = p.keys;
  const float* grads = p.grads;
  const size_t n = p.n;
  const float lr = p.lr;
  const OptimizerKind opt = p.opt;
  StepCtx* ctx = p.ctx;
  std::vector<uint32_t>& order = p.order;
  std::vector<uint32_t>& starts = p.starts;
  group_by_stripe(keys, n, order, starts);
  if (tiers_.memory_rows > 0 && !store_) check_budget(keys, n, order, starts, ctx);
  if (ctx != nullptr) {
    ctx->updated.reserve(n);
    ctx->waiting.reserve(n);
  }
  // Pass 1 (may throw, moves no value): every admitted row resident in DRAM and pinned there.
  // Slots never move while pinned, so they stay valid through pass 2.
  std::vector<uint32_t>& slots = p.slots;
  slots.assign(n, kNoSlot);
  std::vector<uint32_t>& fresh = p.fresh;
  fresh.assign(n, 0);
  std::vector<uint32_t> missing;
  std::vector<int64_t> mkeys;
  std::vector<char> values;
  std::vector<uint8_t> found;
  const uint8_t pin = store_ ? kPinned : 0;
  std::unique_ptr<TierStore::Batch> ahead;  // rows written to SSD before the update
  std::vector<uint8_t>& ahead_stripe = p.ahead_stripe;
  ahead_stripe.assign(stripes_.size(), 0);
  try {
    for (size_t s = 0; s < stripes_.size(); ++s) {
      if (starts[s] == starts[s + 1]) continue;
      Stripe& st = stripes_[s];
      std::lock_guard<std::mutex> lock(st.mu);
      missing.clear();
      const uint32_t end = starts[s + 1];
      for (uint32_t j = starts[s]; j < end; ++j) {
        if (j + kPrefetchAhead < end) st.s.index.prefetch(keys[order[j + kPrefetchAhead]]);
        auto it = st.s.index.find(keys[order[j]]);
        if (it == st.s.index.end()) {
          missing.push_back(j);
          continue;
        }
        slots[j] = it->second;
        if (pin != 0) *flags_ptr(st.s, it->second) |= pin;  // no line touched without tiers
      }
      if (!missing.empty()) {
        const size_t vb = ssd_get_missing(st.s, keys, order.data(), missing, mkeys, values, found);
        const bool ssd = vb > 0;
        for (size_t q = 0; q < missing.size(); ++q) {
          const uint32_t j = missing[q];
          const int64_t key = keys[order[j]];
          if (ssd && found[q]) {
            slots[j] = promote(st.s, key, &values[q * vb]);
            rows_read_ssd_.fetch_add(1, std::memory_order_relaxed);
          } else if (ctx == nullptr || rules_.admits(key)) {
            slots[j] = insert_first_touch(st.s, key);
            fresh[j] = 1;
          } else {
            continue;  // not admitted: no row
          }
          *flags_ptr(st.s, slots[j]) |= pin;
        }
        grow_ahead(s, st);
      }
      if (store_ && st.s.index.size() > st.cap) evict_to(st.s, st.cap);
      // More of this update's rows than the stripe's share: after the update some must leave
      // DRAM, dirty.  Their new values go to SSD now, in one batch with every such stripe's,
      // so that a failing SSD fails the update whole; afterwards they are clean copies and
      // the eviction writes nothing.  Not in a step over several tables (write_ahead false):
      // there the writes of one table would be in its SSD tier while another table's pass 1
      // may still fail; its rows leave DRAM after the update instead (an SSD failure then is
      // one after the step, AppliedThenFailed).
      if (write_ahead && store_ && st.s.index.size() > st.cap) {
        if (!ahead) ahead = std::make_unique<TierStore::Batch>(*store_);
        ahead_stripe[s] = 1;
        std::vector<float> row(dim_), state(sw_);
        for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
          if (slots[j] == kNoSlot) continue;
          const uint32_t i = order[j];
          std::memcpy(row.data(), row_ptr(st.s, slots[j]), row.size() * sizeof(float));
          std::memcpy(state.data(), state_ptr(st.s, slots[j]), state.size() * sizeof(float));
          // The same arithmetic as pass 2's, on copies.
          apply_row(opt, lr, grads + static_cast<size_t>(i) * dim_, row.data(), state.data(), dim_,
                    eps_);
          ahead->put(keys[i], row.data(), state.data(),
                     ctx != nullptr ? ctx->step : *step_ptr(st.s, slots[j]));
        }
      }
    }
    if (ahead) ssd_write(*ahead);  // all or nothing: before any row changes
  } catch (...) {
    // Moves keep values; this update's first-touch rows go again (serial updates only: a
    // concurrent one may use them; a step, ctx, always holds the update lock alone), and the
    // pins go.
    if (serial_ || ctx != nullptr) unpin(starts, slots, &fresh);
    throw;
  }
}

std::optional<TierError> ShardTable::finish_locked(Pass& p) {
  const int64_t* keys = p.keys;
  const float* grads = p.grads;
  const float lr = p.lr;
  const OptimizerKind opt = p.opt;
  StepCtx* ctx = p.ctx;
  const std::vector<uint32_t>& order = p.order;
  const std::vector<uint32_t>& starts = p.starts;
  const std::vector<uint32_t>& slots = p.slots;
  const std::vector<uint32_t>& fresh = p.fresh;
  const std::vector<uint8_t>& ahead_stripe = p.ahead_stripe;
  // Pass 2 (cannot throw): update.
  std::optional<TierError> after;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    const uint32_t end = starts[s + 1];
    const bool meta = store_ != nullptr || ctx != nullptr;  // flags / step written below
    for (uint32_t j = starts[s]; j < std::min(end, starts[s] + kPrefetchAhead); ++j)
      if (slots[j] != kNoSlot) prefetch_slot(st.s, slots[j], true, meta, true);
    for (uint32_t j = starts[s]; j < end; ++j) {
      if (j + kPrefetchAhead < end && slots[j + kPrefetchAhead] != kNoSlot)
        prefetch_slot(st.s, slots[j + kPrefetchAhead], true, meta, true);
      const uint32_t i = order[j], slot = slots[j];
      if (slot == kNoSlot) {
        ctx->waiting.push_back(keys[i]);
        continue;
      }
      apply_row(opt, lr, grads + static_cast<size_t>(i) * dim_, row_ptr(st.s, slot),
                state_ptr(st.s, slot), dim_, eps_);
      if (store_) {
        uint8_t& f = *flags_ptr(st.s, slot);
        if (ahead_stripe[s]) {  // its SSD copy holds the new value already
          if (!(f & kOnSsd)) {
            ++st.s.ssd_keys;
            ++st.s.copies;
          }
          f = static_cast<uint8_t>((f | kOnSsd | kRef) & ~(kPinned | kDirty));
        } else {
          f = static_cast<uint8_t>((f | kDirty | kRef) & ~kPinned);
        }
      }
      if (ctx != nullptr) {
        int64_t& step = *step_ptr(st.s, slot);
        ctx->updated.emplace_back(keys[i], step);
        step = ctx->step;
        ctx->created += fresh[j];
      }
    }
    // Back under the stripe's share (rows written ahead leave without a write).  The update
    // is applied: a failing SSD no longer undoes it, but it is reported (the caller fails),
    // never swallowed.
    if (store_ && st.s.index.size() > st.cap) {
      try {
        evict_to(st.s, st.cap);
      } catch (const TierError& e) {
        if (!after) after.emplace(e);
      }
    }
  }
  // The rows it created may change the tables' shares of the shard's byte budget.
  const int64_t created = std::count(fresh.begin(), fresh.end(), 1u);
  std::optional<TierError> split = after_update(created);
  if (split && !after) after = std::move(split);
  return after;
}

ShardTable::StepResult ShardTable::commit_step(const int64_t* keys, const float* grads, size_t n,
                                               float lr, OptimizerKind opt, int64_t step,
                                               bool wait) {
  std::unique_lock<std::shared_mutex> writer = step_lock();  // rules change here
  lock_or_would_block(writer, wait);
  test_reach(TestPoint::kStepLocked);  // test-only (test_hooks.h)
  return commit_step_locked(keys, grads, n, lr, opt, step);
}

ShardTable::StepResult ShardTable::commit_step_locked(const int64_t* keys, const float* grads,
                                                      size_t n, float lr, OptimizerKind opt,
                                                      int64_t step) {
  const PreparedStepPtr p = prepare_step_locked(keys, grads, n, lr, opt, step, true);
  return finish_step_locked(*p);
}

ShardTable::PreparedStepPtr ShardTable::prepare_step_locked(const int64_t* keys, const float* grads,
                                                            size_t n, float lr, OptimizerKind opt,
                                                            int64_t step, bool write_ahead) {
  PreparedStepPtr p(new PreparedStep);
  p->ctx.step = step;
  rules_.reserve(n);
  p->pass.set(keys, grads, n, lr, opt, &p->ctx);
  prepare_locked(p->pass, write_ahead);
  return p;
}

ShardTable::PreparedStepPtr ShardTable::prepare_push_locked(const int64_t* keys, const float* grads,
                                                            size_t n, float lr, OptimizerKind opt) {
  PreparedStepPtr p(new PreparedStep);
  p->pass.set(keys, grads, n, lr, opt, nullptr);  // a push: no step rules
  prepare_locked(p->pass, false);
  return p;
}

std::optional<TierError> ShardTable::finish_push_locked(PreparedStep& p) {
  return finish_locked(p.pass);
}

void ShardTable::cancel_push_locked(PreparedStep& p) {
  // As prepare_locked's own failure path: only a push that holds the lock alone drops its rows.
  if (serial_) unpin(p.pass.starts, p.pass.slots, &p.pass.fresh);
}

void ShardTable::cancel_step_locked(PreparedStep& p) {
  unpin(p.pass.starts, p.pass.slots, &p.pass.fresh);  // a step holds the update lock alone
}

ShardTable::StepResult ShardTable::finish_step_locked(PreparedStep& p) {
  StepCtx& ctx = p.ctx;
  const int64_t step = ctx.step;
  const std::optional<TierError> after = finish_locked(p.pass);
  for (const auto& [key, old] : ctx.updated) rules_.row_updated(key, old, step);
  for (int64_t key : ctx.waiting) rules_.key_waiting(key, step);
  uint64_t counts_dropped = 0;
  const std::vector<int64_t> drop = rules_.expire(step, &counts_dropped);
  StepResult r;
  r.applied = ctx.updated.size();
  r.admitted = ctx.created;
  rows_admitted_ += ctx.created;
  pending_counts_.store(rules_.pending());
  if (after)
    throw AppliedThenFailed(
        absl::StrCat("the SSD tier failed evicting the step's rows (the DRAM tier is over its "
                     "budget): ",
                     after->what()),
        after->no_space());
  if (!drop.empty()) {
    try {
      r.expired = drop_rows(drop);
    } catch (const TierError& e) {
      throw AppliedThenFailed(
          absl::StrCat("the SSD tier failed dropping its expired rows (part of them remain): ",
                       e.what()),
          e.no_space());
    }
    rows_expired_ += r.expired;
    if (std::optional<TierError> split = after_update(-static_cast<int64_t>(r.expired)))
      throw AppliedThenFailed(
          absl::StrCat("the SSD tier failed evicting rows to the shard's DRAM budget: ",
                       split->what()),
          split->no_space());
  }
  return r;
}

}  // namespace cpu_dist::ps
