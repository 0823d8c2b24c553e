// One shard's table: int64 key -> row of `dim` float32, its optimizer state (the spec's
// state_floats(): 1 float, or dim for Adagrad) and its last-update step (row_meta.h), in a DRAM
// tier and, with an SSD directory, an SSD tier.  Built from its spec (table_spec.h): the
// table's salt (hashing.h) keys its first-touch rows and its partitions.
//
// Striped so that concurrent pulls and pushes rarely meet on a lock: S stripes, chosen by hash
// bits independent of the partition function (otherwise every key of a shard would fall into
// the same few stripes).  Each stripe owns an index (key -> slot) and chunked slot storage:
// blocks that grow geometrically up to a cap, so a big table never reallocates and copies its
// rows, and untouched block tails are never resident.  A slot holds a row, its state, its key,
// its last-update step and a flags byte; freed slots are reused.
//
// Tiers.  The DRAM tier holds at most memory_rows rows (0: unbounded).  Without an SSD tier a
// step or push that would need more is refused whole (MemoryFull).  With one (tier_store.h)
// the rows beyond the budget live in RocksDB and come back on access (pull or update).  The
// SSD tier is inclusive: a row read back from SSD keeps its SSD copy and stays clean until an
// update dirties it, so evicting a clean row costs no write and a pull-heavy trace does not
// rewrite the rows it reads.
// Eviction policy: CLOCK (second chance; Corbato 1968), a reference bit per slot and a hand per
// stripe.  Chosen over LRU because a hit only sets a bit in the slot it already touches (LRU
// would relink a list under the stripe lock on every pull), and over frequency-aware policies
// (LFU, TinyLFU) because those need per-key counters or a sketch beside the rows; under a Zipf
// trace CLOCK's hit rate is close to LRU's.  A stripe over its share of the budget sweeps its
// hand until it is back under it, and the sweep's dirty victims go out in one RocksDB
// WriteBatch.  During an update its rows are pinned in DRAM; a stripe may then exceed its share
// by the rows of that one update until the update is done.
//
// Reads and moves keep values: a row moves between tiers only under its stripe's lock, and an
// eviction writes the row to SSD before it leaves DRAM, so a reader that looks in DRAM first
// and in SSD second never misses a row.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "grow_ahead.h"
#include "huge_pages.h"
#include "memory_budget.h"
#include "optimizer.h"
#include "row_meta.h"
#include "table_rules.h"
#include "table_spec.h"
#include "test_hooks.h"
#include "tier_store.h"

namespace cpu_dist::ps {

// A stripe has no room for another block (slots keep 16 bits of block index), or the DRAM
// tier has no room and there is no SSD tier (MemoryFull).
class TableFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class MemoryFull : public TableFull {
 public:
  using TableFull::TableFull;
};

// An update whose rows were all applied, after which the SSD tier failed (evicting the rows
// the update brought in, or expiry's drops): the table holds the update (no row half changed);
// what failed is left undone (rows over the DRAM budget, part of the drops).
class AppliedThenFailed : public std::runtime_error {
 public:
  AppliedThenFailed(const std::string& msg, bool no_space)
      : std::runtime_error(msg), no_space_(no_space) {}
  bool no_space() const { return no_space_; }

 private:
  bool no_space_;
};

// Thrown by an update asked not to wait (wait = false) when the table's update lock is taken
// (a Save froze the table, or another update holds it): nothing was done.  Not a
// std::exception: no handler of real failures catches it by mistake.
struct WouldBlock {};

// Takes `lock` (a deferred unique_lock or shared_lock): waiting for it, or with wait = false
// only if it is free, else WouldBlock.  The one rule for every update that may not wait.
template <class Lock>
void lock_or_would_block(Lock& lock, bool wait) {
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    throw WouldBlock();
  }
}

struct TierOptions {
  uint64_t memory_rows = 0;        // DRAM tier, rows (0: unbounded)
  std::string ssd_dir;             // SSD tier under this directory (empty: none)
  std::string ssd_name = "shard";  // prefix of the store's own directory in ssd_dir
  // The shard's DRAM budget in bytes, shared by its tables (memory_budget.h); null: none (then
  // memory_rows, a one-table budget).  Needs an SSD tier.
  std::shared_ptr<MemoryBudget> budget;
};

struct TierStats {
  uint64_t rows_dram = 0, rows_ssd = 0, ssd_bytes = 0;
  uint64_t rows_admitted = 0, rows_expired = 0, pending_counts = 0;
  uint64_t rows_read_ssd = 0;
  uint64_t blocks_ahead = 0;  // slot blocks faulted in ahead of the updates (grow_ahead.h)
};

class ShardTable {
 public:
  // max_blocks_per_stripe caps each stripe's slot storage (clamped to 1..65536).  The rules
  // are the spec's (admit_after, expire_after).
  explicit ShardTable(ShardTableSpec spec, uint32_t num_stripes = 16,
                      uint32_t max_blocks_per_stripe = 65536, TierOptions tiers = {});
  // The one flag-declared table "embedding" (as before tables existed).
  ShardTable(uint32_t dim, uint64_t seed, float init_scale, uint32_t num_stripes = 16,
             uint32_t max_blocks_per_stripe = 65536, TierOptions tiers = {},
             RuleOptions rules = {});
  ~ShardTable();
  ShardTable(const ShardTable&) = delete;
  ShardTable& operator=(const ShardTable&) = delete;

  uint32_t dim() const { return dim_; }
  const ShardTableSpec& spec() const { return spec_; }
  // Floats of optimizer state per row (spec().state_floats()): every state_out below holds
  // n * state_floats() floats, row after row.
  uint32_t state_floats() const { return sw_; }
  const TierOptions& tier_options() const { return tiers_; }
  const RuleOptions& rule_options() const { return rules_.options(); }

  // A pull: copies the rows of `keys` into out (n * dim floats, may be unaligned: it is usually
  // a reply buffer behind a protobuf header); absent rows are computed with row_init and NOT
  // inserted (a pull never grows the table).  Rows found only on SSD are brought into DRAM
  // (not while the table is frozen).  Throws TierError when the SSD tier cannot be read.
  void gather(const int64_t* keys, size_t n, void* out) const;
  // A pull that also reports each row's state (n * state_floats() floats) and last-update job
  // step (n int64, kNoStep: none), read under the row's lock with it; either may be null.
  void gather(const int64_t* keys, size_t n, void* out, void* state_out, void* step_out) const;
  // Like gather, with the states (n * state_floats() floats) and last-update steps (n int64)
  // when not null (all may be unaligned), and without moving any row between tiers: Dump
  // and Save.
  void read(const int64_t* keys, size_t n, void* out, void* state_out, void* step_out) const;

  // A push: one gradient row per key, applied directly (no step rules).  Keys must be unique
  // (callers merge duplicates first).  Absent rows are inserted with their first-touch values
  // before the update.  All or nothing: every row is made resident (and every missing one
  // inserted) before any row changes, so a throw (TableFull, MemoryFull, TierError, bad_alloc)
  // leaves every value as it was.  Waits while the table is frozen.
  // With wait false it throws WouldBlock (nothing done) instead of waiting for the lock.
  void apply(const int64_t* keys, const float* grads, size_t n, float lr, OptimizerKind opt,
             bool wait = true);

  // A push over several tables (push_tables, tables.h) takes every table's push lock, in name
  // order, before it changes any table (with wait false: WouldBlock, nothing changed), then
  // runs each table's two halves below.  A push holds the update lock exclusively on a
  // serial table (tiers or rules: its passes move rows between tiers and count keys), shared
  // otherwise, so that pushes of several workers to a DRAM table run side by side.
  class PushLock {
   public:
    PushLock(std::shared_mutex& mu, bool exclusive)
        : exclusive_(exclusive), unique_(mu, std::defer_lock), shared_(mu, std::defer_lock) {}
    void lock(bool wait) {
      if (exclusive_) {
        lock_or_would_block(unique_, wait);
      } else {
        lock_or_would_block(shared_, wait);
      }
    }

   private:
    bool exclusive_;
    std::unique_lock<std::shared_mutex> unique_;
    std::shared_lock<std::shared_mutex> shared_;
  };
  PushLock push_lock() const { return PushLock(update_mu_, serial_); }

  // A committed step at job step `step`: the step rules (table_rules.h) around an apply.  The
  // apply is all or nothing as above; expiry runs after it.  An SSD failure after the rows
  // were applied (expiry's drops, or evicting what the step brought in) throws
  // AppliedThenFailed: the step is in the table, the caller's session fails.
  struct StepResult {
    size_t applied = 0;   // rows updated
    size_t admitted = 0;  // rows created
    size_t expired = 0;   // rows dropped
  };
  StepResult commit_step(const int64_t* keys, const float* grads, size_t n, float lr,
                         OptimizerKind opt, int64_t step, bool wait = true);
  // A step over several tables (commit_tables_step, tables.h) takes every table's step lock
  // (deferred here; lock_or_would_block), in name order, before it changes any table, then
  // runs each table's two halves below.
  std::unique_lock<std::shared_mutex> step_lock() const {
    return std::unique_lock<std::shared_mutex>(update_mu_, std::defer_lock);
  }
  StepResult commit_step_locked(const int64_t* keys, const float* grads, size_t n, float lr,
                                OptimizerKind opt, int64_t step);
  // commit_step_locked in two halves, so that a step over several tables changes none of them
  // unless every one can take it: prepare (pass 1: every row resident and pinned; throws with
  // this table unchanged), then finish (pass 2 and the step rules; throws only
  // AppliedThenFailed) or cancel (unpins; drops the first-touch rows it made; cannot fail).
  // write_ahead false: rows over a stripe's DRAM share leave after the update rather than
  // being written to SSD in pass 1 (table_tiers.cc).  The caller holds the step lock.
  struct PreparedStep;
  struct PreparedStepDeleter {
    void operator()(PreparedStep* p) const;
  };
  using PreparedStepPtr = std::unique_ptr<PreparedStep, PreparedStepDeleter>;
  PreparedStepPtr prepare_step_locked(const int64_t* keys, const float* grads, size_t n, float lr,
                                      OptimizerKind opt, int64_t step, bool write_ahead);
  StepResult finish_step_locked(PreparedStep& p);
  void cancel_step_locked(PreparedStep& p);
  // A push's two halves under its push lock: prepare (pass 1, as apply's, but writing nothing
  // to the SSD tier ahead: another table's pass 1 may still fail), then finish (pass 2: the
  // SSD failure of an eviction after the rows changed, if any, as apply_locked returns it) or
  // cancel (unpins; a serial table's first-touch rows go again, a shared push's stay: a
  // concurrent push may have found them, and they read as the absent rows they replaced).
  PreparedStepPtr prepare_push_locked(const int64_t* keys, const float* grads, size_t n, float lr,
                                      OptimizerKind opt);
  std::optional<TierError> finish_push_locked(PreparedStep& p);
  void cancel_push_locked(PreparedStep& p);

  // Calls fn(key) for every row in DRAM, one stripe at a time under that stripe's lock (so
  // pulls and updates of other stripes go on).  fn must not call back into the table.
  template <class Fn>
  void for_each_key(Fn&& fn) const {
    for (const Stripe& st : stripes_) {
      std::lock_guard<std::mutex> lock(st.mu);
      for (const auto& entry : st.s.index) fn(entry.first);
    }
  }
  // The SSD tier's rows (and copies) in (partition, key) order up to end_partition; null
  // without an SSD tier.  `bulk`: reads far ahead (a checkpoint).
  std::unique_ptr<TierStore::Cursor> ssd_cursor(uint32_t end_partition, bool bulk) const;
  // A value from ssd_cursor() (tier_store.h): row (dim floats), state, last-update step.
  void ssd_decode(const char* value, float* row, float* state, int64_t* step) const {
    store_->decode_value(value, row, state, step);
  }
  // fn(key, count, last_seen) for every count of a key without a row (table_rules.h).  Only
  // while frozen.
  template <class Fn>
  void for_each_pending(Fn&& fn) const {
    rules_.for_each_pending(fn);
  }

  // While a Frozen lives nothing changes the table (updates and adopt wait; pulls go on, they
  // only read, and move no row between tiers): what a checkpoint needs to write a consistent
  // snapshot in pieces.
  class Frozen {
   public:
    Frozen(std::shared_mutex& mu, std::atomic<int>& flag) : lock_(mu), flag_(flag) { ++flag_; }
    ~Frozen() { --flag_; }
    Frozen(const Frozen&) = delete;
    Frozen& operator=(const Frozen&) = delete;

   private:
    std::unique_lock<std::shared_mutex> lock_;
    std::atomic<int>& flag_;
  };
  Frozen freeze() const { return Frozen(update_mu_, frozen_); }

  // Rows built aside from the live table, then swapped in at once: how a checkpoint is loaded
  // all or nothing.  Rows fill DRAM up to the budget; with an SSD tier every row also goes to
  // a fresh store (they must come in ascending (partition, key) order for that), so the rows in
  // DRAM start as clean copies.  stage_* and finish_staged
  // may throw (a duplicate key, TableFull, MemoryFull, TierError, bad_alloc); the live table is
  // untouched until adopt(), which cannot fail.
  class Staged;
  // `threads` fault the new DRAM tier's memory in (table_load.cc).
  std::unique_ptr<Staged> new_staged(size_t expected_rows, size_t threads = 1) const;
  // steps may be null (a version 1 file: kNoStep).
  void stage_rows(Staged& st, const int64_t* keys, const float* values, const float* state,
                  const int64_t* steps, size_t n) const;
  void stage_pending(Staged& st, int64_t key, int64_t count, int64_t last_seen) const;
  void finish_staged(Staged& st) const;
  void adopt(Staged& st);  // the live rows become st's (and st holds the old ones)

  // The highest job step any row may hold (kNoStep: none): raised by note_step before a
  // commit writes rows at that step, and by adopt() to the loaded rows' highest.  What a
  // session started later knows of the steps in rows that are not its own.
  void note_step(int64_t step) {
    int64_t cur = max_step_.load();
    while (step > cur && !max_step_.compare_exchange_weak(cur, step)) {
    }
  }
  int64_t max_step() const { return max_step_.load(); }

  // Test-only pause points (test_hooks.h); null (the default): none.
  void set_test_hooks(TestHooks* hooks) { hooks_ = hooks; }
  void test_reach(TestPoint p) const {
    if (hooks_ != nullptr) hooks_->reach(p);
  }

  uint64_t rows() const;
  // What one row costs in DRAM under a byte budget (memory_budget.h): its slot (values, state,
  // key, last-update step, flags) and its key index entry.
  uint64_t row_bytes() const;
  // Bytes held by the DRAM tier: slots and index (capacity, not just what is in use).
  uint64_t bytes() const;
  TierStats tier_stats() const;

  // First-touch value of a whole row (the formula of hashing.h, hoisted per row).
  void init_row(int64_t key, float* out) const;

 private:
  using Block = SlotBlock;

  // Everything a stripe holds (adopt swaps it whole).
  using KeyIndex =
      absl::flat_hash_map<int64_t, uint32_t, absl::Hash<int64_t>, std::equal_to<int64_t>,
                          HugePageAllocator<std::pair<const int64_t, uint32_t>>>;
  struct Slots {
    KeyIndex index;  // key -> (block << 16) | offset
    std::vector<Block> blocks;
    uint32_t used_in_last = 0;   // slots ever used in blocks.back()
    std::vector<uint32_t> free;  // released slots (capacity kept: release never allocates)
    std::vector<Block> spare;    // blocks faulted in ahead (a load's, or grow_ahead_'s), next last
    uint32_t hand_block = 0, hand_off = 0;  // CLOCK hand
    uint64_t copies = 0;                    // rows in DRAM with a copy in the SSD tier
    uint64_t ssd_keys = 0;                  // keys of this stripe in the SSD tier
  };
  struct Stripe {
    mutable std::mutex mu;
    Slots s;
    uint64_t cap = UINT64_MAX;  // DRAM rows (its share of memory_rows with an SSD tier)
    // Admission doorkeeper of pulls (TinyLFU's): one bit per hashed key read from SSD; a row
    // comes into DRAM on its second read within a window, and the bits clear after `cap`
    // new ones.
    std::vector<uint64_t> seen;
    uint64_t seen_marked = 0;
    // The block index asked of grow_ahead_ and not yet filed (or dropped): asked once.
    size_t ahead_asked = SIZE_MAX;
  };
  struct StepCtx;

  static constexpr uint32_t kFirstBlockRows = 64;
  static constexpr uint32_t kMaxBlockRows = 16384;  // must stay <= 65536 (16-bit offset)
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  static constexpr size_t kCacheLine = 64;
  // How many rows ahead of its use a batch loop asks for a row (prefetch_slot) or an index
  // probe: enough misses in flight to cover DRAM latency, few enough to stay in L1/L2.
  static constexpr uint32_t kPrefetchAhead = 8;
  // flags byte of a slot
  static constexpr uint8_t kUsed = 1, kRef = 2, kDirty = 4, kOnSsd = 8, kPinned = 16;

  static uint32_t block_rows(size_t block) {
    return block >= 8 ? kMaxBlockRows : (kFirstBlockRows << block);
  }
  uint32_t stripe_of(int64_t key) const;
  std::string store_dir() const;  // a fresh directory for a TierStore under ssd_dir
  // Slot fields: row (dim floats), state (sw_ floats), key, last-update step, flags.
  float* row_ptr(const Slots& s, uint32_t slot) const;
  float* state_ptr(const Slots& s, uint32_t slot) const;
  int64_t* key_ptr(const Slots& s, uint32_t slot) const;
  int64_t* step_ptr(const Slots& s, uint32_t slot) const;
  uint8_t* flags_ptr(const Slots& s, uint32_t slot) const;
  // Asks the CPU for a slot's row lines (its state lines where `state`, its step and flags where
  // `meta`) ahead of their use, so that the cache misses of a batch's next rows overlap: the
  // rows are random over the table, and one miss per row in turn bounds small RPCs otherwise.
  // `update`: the caller will write the row and state (a pull only reads them).
  void prefetch_slot(const Slots& s, uint32_t slot, bool state, bool meta, bool update) const;

  // ---- slots (table.cc); the caller holds the stripe's lock ----
  // A slot for `key`, in the index, flags kUsed; kNoSlot (nothing changed) when the key is
  // already there.  Throws TableFull or bad_alloc.
  uint32_t take_slot(Slots& s, int64_t key) const;
  // Allocates the blocks rows_per_stripe rows per stripe fill, handed to new_slot as the
  // stripes' spare blocks, and starts `threads` threads that fault them in (table_load.cc).
  void prefault_blocks(Staged& st, size_t rows_per_stripe, size_t threads) const;
  // The SSD tier's values of keys[order[missing[q]]] (a stripe's rows not in DRAM) into
  // values, found[q] whether each is there.  Returns the bytes of one value, or 0 (nothing
  // looked up) when the stripe has no row that is only on SSD.
  size_t ssd_get_missing(const Slots& s, const int64_t* keys, const uint32_t* order,
                         const std::vector<uint32_t>& missing, std::vector<int64_t>& mkeys,
                         std::vector<char>& values, std::vector<uint8_t>& found) const;
  uint32_t new_slot(Slots& s) const;  // throws TableFull or bad_alloc
  // Caller holds stripe i's lock, after an update's inserts: asks grow_ahead_ for the stripe's
  // next block once its current one is half full (tables without tiers; grow_ahead.h).
  void grow_ahead(size_t i, Stripe& st) const;
  // grow_ahead_'s delivery: files blk as stripe i's spare if it still needs block `block`.
  bool file_spare(size_t i, size_t block, Block& blk) const;
  void release(Slots& s, uint32_t slot) const;  // cannot fail
  uint32_t insert_first_touch(Slots& s, int64_t key) const;
  // order[] gets the indices 0..n-1 grouped by stripe; starts[s]..starts[s+1] is stripe s.
  void group_by_stripe(const int64_t* keys, size_t n, std::vector<uint32_t>& order,
                       std::vector<uint32_t>& starts) const;
  void gather_impl(const int64_t* keys, size_t n, void* out, void* state_out, void* step_out,
                   bool may_move) const;

  // ---- tiers (table_tiers.cc); the caller holds the stripe's lock ----
  // The doorkeeper: whether a pull read `key` from SSD before (in this window); marks it.
  static bool seen_before(Stripe& st, int64_t key);
  // A row read from SSD into DRAM as a clean copy.  Throws TableFull or bad_alloc.
  uint32_t promote(Slots& s, int64_t key, const char* value) const;
  // CLOCK: evicts unpinned rows until at most `target` are resident, writing the dirty ones
  // in one batch first.  Returns how many left; throws TierError (then nothing left).
  size_t evict_to(Slots& s, uint64_t target) const;
  // Every write to the SSD tier (all or nothing; throws TierError, also a test's fault).
  void ssd_write(TierStore::Batch& batch) const;
  // Drops rows (expiry): from DRAM, and from SSD in one batch per stripe.
  size_t drop_rows(const std::vector<int64_t>& keys);
  // The update (table_tiers.cc): pins every admitted row in DRAM (evicting others, and where
  // the update alone exceeds a stripe's share writing its new rows to SSD ahead, so that a
  // failing SSD fails the update whole), applies, unpins.  Returns the error of an eviction
  // after the update (nullopt: none; it writes nothing but in a failure nobody foresaw): the
  // caller throws AppliedThenFailed once its own bookkeeping is done.
  // apply_locked's two passes (Pass: where the update's rows are, between them).
  struct Pass;
  void prepare_locked(Pass& p, bool write_ahead);
  std::optional<TierError> finish_locked(Pass& p);
  std::optional<TierError> apply_locked(const int64_t* keys, const float* grads, size_t n, float lr,
                                        OptimizerKind opt, StepCtx* ctx);
  void check_budget(const int64_t* keys, size_t n, const std::vector<uint32_t>& order,
                    const std::vector<uint32_t>& starts, const StepCtx* ctx) const;
  // After a failed pass 1: unpins, and releases the `fresh` (first-touch) rows.
  void unpin(const std::vector<uint32_t>& starts, const std::vector<uint32_t>& slots,
             const std::vector<uint32_t>* fresh);
  // ---- the shard's byte budget (memory_budget.h, table_tiers.cc) ----
  friend class MemoryBudget;
  // Every stripe's row cap from the table's share, `rows` (locks each stripe in turn).
  void set_dram_cap(uint64_t rows);
  // The rows the stripes' caps hold together (what a load fills DRAM with at most).
  uint64_t dram_cap_rows() const;
  // Evicts every stripe down to its cap (not while frozen): the first SSD failure, if any.
  std::optional<TierError> shrink_to_caps();
  // After an update that created (or dropped) rows: splits the budget again when the row
  // count moved far enough since the last split.  The first SSD failure, if any.
  std::optional<TierError> after_update(int64_t rows_delta);

  const ShardTableSpec spec_;
  const uint32_t dim_;
  const uint32_t sw_;    // state floats per row (spec_.state_floats())
  const uint64_t seed_;  // the spec's seed ^ its salt: row_init's seed (hashing.h)
  const float init_scale_;
  const float eps_;  // Adagrad's (apply_row)
  const uint32_t max_blocks_;
  const size_t slot_bytes_;  // per slot in a block
  const TierOptions tiers_;
  // Promotion moves a row between tiers without changing any value, so const reads may do it
  // (under the stripe's lock).
  mutable std::vector<Stripe> stripes_;
  std::unique_ptr<TierStore> store_;  // null without an SSD tier
  StepRules rules_;                   // changed only under update_mu_, exclusively
  // Updates (push: shared, unless tiers or rules make them exclusive; commit_step and adopt:
  // exclusive) against a checkpoint's freeze (exclusive).  Taken before any stripe lock.
  mutable std::shared_mutex update_mu_;
  mutable std::atomic<int> frozen_{0};
  const bool serial_;  // pushes take update_mu_ exclusively
  std::atomic<uint64_t> rows_admitted_{0}, rows_expired_{0}, pending_counts_{0};
  mutable std::atomic<uint64_t> rows_read_ssd_{0};
  std::atomic<int64_t> max_step_{kNoStep};
  // Rows created minus dropped since the budget's last split, and the rows then.
  std::atomic<int64_t> rows_since_split_{0};
  std::atomic<uint64_t> rows_at_split_{0};
  // A split left this table over its cap (its update lock was taken): its next update evicts.
  std::atomic<bool> shrink_due_{false};
  TestHooks* hooks_ = nullptr;
  // Faults the growing stripes' next blocks in (DRAM-only tables: a tier's budget would have
  // to count blocks held ahead).  Last: stopped before anything it files into goes.
  const bool grows_ahead_;
  mutable GrowAhead grow_ahead_;
};

class ShardTable::Staged {
 public:
  Staged(size_t num_stripes, RuleOptions rules) : stripes(num_stripes), rules(rules) {}
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  ~Staged() { stop_prefault(); }
  size_t rows = 0;

 private:
  friend class ShardTable;
  int64_t max_step = kNoStep;  // of the staged rows
  // Ends the threads that fault the spare blocks in (before the blocks may be freed).
  void stop_prefault() {
    prefault_stop.store(true, std::memory_order_relaxed);
    for (std::thread& t : prefault) t.join();
    prefault.clear();
  }
  std::vector<Slots> stripes;
  std::unique_ptr<TierStore> store;
  std::unique_ptr<TierStore::BulkLoader> loader;
  StepRules rules;
  std::atomic<bool> prefault_stop{false};
  std::vector<std::thread> prefault;  // fault the spare blocks in while the load reads
};

}  // namespace cpu_dist::ps
