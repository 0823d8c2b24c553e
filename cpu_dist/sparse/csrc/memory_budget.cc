// The shard's byte budget (memory_budget.h): each table's row bytes and DRAM caps, the check
// after an update that changed a table's rows enough to split the budget again, and the split
// itself over the shard's tables.
#include "memory_budget.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "table.h"

namespace cpu_dist::ps {

uint64_t ShardTable::row_bytes() const {
  // The slot, and the index's slot (key, slot number) with its control byte.
  return slot_bytes_ + sizeof(std::pair<const int64_t, uint32_t>) + 1;
}

void ShardTable::set_dram_cap(uint64_t rows) {
  const uint64_t S = stripes_.size();
  for (uint64_t s = 0; s < S; ++s) {
    Stripe& st = stripes_[s];
    const uint64_t cap = rows / S + (s < rows % S);
    size_t bits = 64;  // the doorkeeper: 4 bits per row of the cap (table.h)
    while (bits < 4 * cap) bits <<= 1;
    std::lock_guard<std::mutex> lock(st.mu);
    st.cap = cap;
    if (st.seen.size() * 64 != bits) {
      st.seen.assign(bits / 64, 0);
      st.seen_marked = 0;
    }
  }
}

uint64_t ShardTable::dram_cap_rows() const {
  uint64_t rows = 0;
  for (const Stripe& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    rows = st.cap == UINT64_MAX ? UINT64_MAX : rows + st.cap;
    if (rows == UINT64_MAX) break;
  }
  return rows;
}

std::optional<TierError> ShardTable::shrink_to_caps() {
  if (!store_ || frozen_.load() != 0) return std::nullopt;
  std::optional<TierError> err;
  for (Stripe& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.s.index.size() <= st.cap) continue;
    try {
      evict_to(st.s, st.cap);
    } catch (const TierError& e) {
      if (!err) err.emplace(e);
    }
  }
  return err;
}

std::optional<TierError> ShardTable::after_update(int64_t rows_delta) {
  if (!tiers_.budget) return std::nullopt;
  // A split this table's lock kept out of (a step over several tables holds them all): the
  // caller holds the lock now, so no freeze is under way.
  std::optional<TierError> caught_up;
  if (shrink_due_.exchange(false)) caught_up = shrink_to_caps();
  const int64_t moved = rows_since_split_.fetch_add(rows_delta) + rows_delta;
  // A sixteenth of the rows at the last split, and at least a few rows per stripe.
  const uint64_t enough = rows_at_split_.load() / 16 + 16 * stripes_.size();
  if (static_cast<uint64_t>(std::abs(moved)) <= enough) return caught_up;
  std::optional<TierError> split = tiers_.budget->rebalance_from(this);
  return caught_up ? caught_up : split;
}

void MemoryBudget::attach(ShardTable* table) {
  std::lock_guard<std::mutex> lock(mu_);
  tables_.push_back(table);
  split_locked(nullptr);  // nothing to evict in a table this new: an SSD failure waits
}

void MemoryBudget::detach(ShardTable* table) {
  std::lock_guard<std::mutex> lock(mu_);
  tables_.erase(std::remove(tables_.begin(), tables_.end(), table), tables_.end());
}

std::optional<TierError> MemoryBudget::rebalance() { return rebalance_from(nullptr); }

std::optional<TierError> MemoryBudget::rebalance_from(ShardTable* held) {
  std::lock_guard<std::mutex> lock(mu_);
  return split_locked(held);
}

std::optional<TierError> MemoryBudget::split_locked(ShardTable* held) {
  if (tables_.empty()) return std::nullopt;
  // Weights: the bytes of each table's rows, and a floor so that a new table has room at once.
  constexpr uint64_t kFloorRows = 256;
  std::vector<uint64_t> rows(tables_.size());
  std::vector<long double> weight(tables_.size());
  long double total = 0;
  for (size_t i = 0; i < tables_.size(); ++i) {
    rows[i] = tables_[i]->rows();
    weight[i] = static_cast<long double>(rows[i] + kFloorRows) * tables_[i]->row_bytes();
    total += weight[i];
  }
  for (size_t i = 0; i < tables_.size(); ++i) {
    ShardTable& t = *tables_[i];
    // Rounded down, so the caps' bytes never sum to more than the budget.
    const long double share = static_cast<long double>(bytes_) * (weight[i] / total);
    t.set_dram_cap(static_cast<uint64_t>(share / t.row_bytes()));
    t.rows_at_split_.store(rows[i]);
    t.rows_since_split_.store(0);
  }
  // Evict what is over the new caps.  A table whose update lock is taken (an update in
  // progress, or a checkpoint's freeze) is left alone until the next split: evicting under a
  // freeze would move rows under the checkpoint's feet.  `held`'s lock is the caller's.
  std::optional<TierError> err;
  for (ShardTable* t : tables_) {
    std::optional<TierError> e;
    if (t == held) {
      e = t->shrink_to_caps();
    } else {
      std::shared_lock<std::shared_mutex> other(t->update_mu_, std::try_to_lock);
      if (other.owns_lock()) {
        e = t->shrink_to_caps();
      } else {
        t->shrink_due_.store(true);
      }
    }
    if (e && !err) err = std::move(e);
  }
  return err;
}

uint64_t MemoryBudget::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t b = 0;
  for (const ShardTable* t : tables_) b += t->tier_stats().rows_dram * t->row_bytes();
  return b;
}

}  // namespace cpu_dist::ps
