// ShardTable: rows staged aside from the live table (a checkpoint being loaded), then adopted
// whole.  Rows fill each stripe's share of DRAM in the order they come; with an SSD tier every
// row also goes to a fresh store in sorted SST files (the checkpoint's (partition, key) order
// is the store's key order), so a load writes each row once, nothing is compacted, and the
// rows in DRAM are clean copies that leave DRAM without a write.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "table.h"

namespace cpu_dist::ps {

namespace {
constexpr size_t kParallelStageRows = 512;  // a thread start costs about as much as 20 rows
}  // namespace

std::unique_ptr<ShardTable::Staged> ShardTable::new_staged(size_t expected_rows,
                                                           size_t threads) const {
  if (tiers_.memory_rows > 0 && !store_ && expected_rows > tiers_.memory_rows)
    throw MemoryFull(absl::StrCat("the checkpoint holds ", expected_rows,
                                  " rows for this shard, over --ps-memory-rows ",
                                  tiers_.memory_rows,
                                  " rows per shard; raise --ps-memory-rows or give the shards an "
                                  "SSD tier with --ps-ssd-dir"));
  auto st = std::make_unique<Staged>(stripes_.size(), rules_.options());
  if (store_) st->store = std::make_unique<TierStore>(store_dir(), dim_, spec_.salt(), sw_);
  size_t in_dram = expected_rows;
  if (store_ && tiers_.memory_rows > 0) in_dram = std::min<uint64_t>(in_dram, tiers_.memory_rows);
  if (store_ && tiers_.budget) in_dram = std::min<uint64_t>(in_dram, dram_cap_rows());
  const size_t per = in_dram / stripes_.size();
  for (Slots& s : st->stripes) s.index.reserve(per + per / 16 + 16);
  prefault_blocks(*st, per - per / 32, std::max<size_t>(threads, 1));
  return st;
}

void ShardTable::prefault_blocks(Staged& staged, size_t rows_per_stripe, size_t threads) const {
  // The blocks that rows_per_stripe rows fill (a little under each stripe's share, so that
  // almost none is left unused), faulted in by every core while the load reads: in a VM,
  // memory the process never touched arrives at 0.5-0.9 GB/s per thread (measured), and a
  // restore of a big table was mostly waiting for it, one page fault at a time, on the
  // inserting threads.  Block b of every stripe comes before block b+1 of any: the order the
  // inserts use them in, so the faults stay ahead of them.
  using Pages = std::pair<char*, size_t>;  // one block: where, how many bytes
  std::vector<std::vector<Pages>> by_block;
  for (Slots& s : staged.stripes) {
    size_t covered = 0;
    for (size_t b = 0; covered < rows_per_stripe && b < max_blocks_; ++b) {
      const size_t bytes = block_rows(b) * slot_bytes_;
      Block blk(static_cast<char*>(std::malloc(bytes)));
      if (blk == nullptr) throw std::bad_alloc();
      if (by_block.size() <= b) by_block.resize(b + 1);
      by_block[b].emplace_back(blk.get(), bytes);
      s.spare.push_back(std::move(blk));
      covered += block_rows(b);
    }
    std::reverse(s.spare.begin(), s.spare.end());
  }
  std::vector<Pages> pages;
  for (const std::vector<Pages>& blocks : by_block)
    pages.insert(pages.end(), blocks.begin(), blocks.end());
  const auto populate = [](const Pages& r) { return populate_pages(r.first, r.second); };
  if (pages.empty()) return;
  if (!populate(pages.front())) {
    // A kernel before 5.14: touch every page now, before any row is written (a write in the
    // background could race an insert).
    for (const auto& [p, bytes] : pages) touch_pages(p, bytes);
    return;
  }
  // MADV_POPULATE_WRITE never changes a page that is there, so it may run beside the inserts.
  auto shared = std::make_shared<std::vector<Pages>>(std::move(pages));
  auto next = std::make_shared<std::atomic<size_t>>(1);  // the first is populated above
  std::atomic<bool>* stop = &staged.prefault_stop;
  for (size_t t = 0; t < threads; ++t)
    staged.prefault.emplace_back([shared, next, stop, populate] {
      for (size_t i; !stop->load(std::memory_order_relaxed) &&
                     (i = next->fetch_add(1, std::memory_order_relaxed)) < shared->size();)
        populate((*shared)[i]);
    });
}

// state: n * sw_ floats, row after row (the checkpoint block's layout).
void ShardTable::stage_rows(Staged& staged, const int64_t* keys, const float* values,
                            const float* state, const int64_t* steps, size_t n) const {
  if (steps != nullptr)
    for (size_t i = 0; i < n; ++i) staged.max_step = std::max(staged.max_step, steps[i]);
  // The SSD tier and the expiry buckets take every row, in the order the rows come
  // (ascending, which the SSD files need).
  if (staged.store || (steps != nullptr && staged.rules.expiring())) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t step = steps != nullptr ? steps[i] : kNoStep;
      if (staged.store) {  // without an SSD tier every cap is unbounded
        if (!staged.loader) staged.loader = std::make_unique<TierStore::BulkLoader>(*staged.store);
        staged.loader->add(keys[i], values + i * dim_, state + i * sw_, step);
        ++staged.stripes[stripe_of(keys[i])].ssd_keys;
      }
      if (step != kNoStep) staged.rules.restore_row(keys[i], step);
    }
  }
  // DRAM: stripes [first, end) by one thread, one stripe at a time (its index stays in cache
  // while it grows); each thread picks its stripes' rows itself, so nothing runs alone.
  const auto insert = [&](size_t first, size_t end) {
    std::vector<std::vector<uint32_t>> dram(end - first);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = stripe_of(keys[i]);
      if (s < first || s >= end) continue;
      if (staged.stripes[s].index.size() + dram[s - first].size() < stripes_[s].cap)
        dram[s - first].push_back(static_cast<uint32_t>(i));
    }
    for (size_t s = first; s < end; ++s) {
      Slots& sl = staged.stripes[s];
      const std::vector<uint32_t>& rows = dram[s - first];
      for (size_t q = 0; q < rows.size(); ++q) {
        if (q + kPrefetchAhead < rows.size()) {
          const size_t ahead = rows[q + kPrefetchAhead];
          __builtin_prefetch(values + ahead * dim_);
          sl.index.prefetch(keys[ahead]);
        }
        const size_t i = rows[q];
        const uint32_t slot = take_slot(sl, keys[i]);
        if (slot == kNoSlot) throw std::invalid_argument(absl::StrCat("duplicate key ", keys[i]));
        std::memcpy(row_ptr(sl, slot), values + i * dim_, dim_ * sizeof(float));
        std::memcpy(state_ptr(sl, slot), state + i * sw_, sw_ * sizeof(float));
        *step_ptr(sl, slot) = steps != nullptr ? steps[i] : kNoStep;
        if (staged.store) {
          *flags_ptr(sl, slot) |= kOnSsd;  // a clean copy
          ++sl.copies;
        }
      }
    }
  };
  // The stripes are independent: a big block is inserted by two threads (measured: inserting
  // was most of a restore's time, on one core).
  const size_t S = stripes_.size();
  if (n < kParallelStageRows || S < 2) {
    insert(0, S);
  } else {
    std::exception_ptr helper_error;
    std::thread helper([&] {
      try {
        insert(0, S / 2);
      } catch (...) {
        helper_error = std::current_exception();
      }
    });
    try {
      insert(S / 2, S);
    } catch (...) {
      helper.join();
      throw;
    }
    helper.join();
    if (helper_error) std::rethrow_exception(helper_error);
  }
  staged.rows += n;
}

void ShardTable::stage_pending(Staged& staged, int64_t key, int64_t count,
                               int64_t last_seen) const {
  staged.rules.restore_pending(key, count, last_seen);
}

void ShardTable::finish_staged(Staged& staged) const {
  staged.stop_prefault();
  for (Slots& s : staged.stripes) s.spare.clear();  // what the estimate made too many
  if (!staged.loader) return;
  staged.loader->finish();
  staged.loader.reset();
}

void ShardTable::adopt(Staged& staged) {
  std::unique_lock<std::shared_mutex> writer(update_mu_);
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(stripes_.size());
  for (auto& st : stripes_) locks.emplace_back(st.mu);
  size_t old_rows = 0;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    old_rows += stripes_[s].s.index.size() + (stripes_[s].s.ssd_keys - stripes_[s].s.copies);
    std::swap(stripes_[s].s, staged.stripes[s]);
  }
  std::swap(store_, staged.store);  // the old store goes with `staged`
  rules_.swap(staged.rules);
  pending_counts_.store(rules_.pending());
  note_step(staged.max_step);  // the old rows' steps may stay in sessions' bounds: harmless
  staged.rows = old_rows;
}

}  // namespace cpu_dist::ps
