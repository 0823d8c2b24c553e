// One shard's table: int64 key -> row of `dim` float32 plus one float optimizer accumulator.
//
// Striped so that concurrent pulls and pushes rarely meet on a lock: S stripes, chosen by
// hash bits independent of the partition function (otherwise every key of a shard would
// fall into the same few stripes).  Each stripe owns an index (key -> slot) and chunked row
// storage: blocks that grow geometrically up to a cap, so a big table never reallocates and
// copies its rows, and untouched block tails are never resident.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "optimizer.h"

namespace cpu_dist::ps {

// Rows with their optimizer state, as a client assembles a dump.
struct TableDump {
  std::vector<int64_t> keys;  // sorted ascending
  std::vector<float> values;  // keys.size() * dim
  std::vector<float> state;   // keys.size()
};

// A stripe has no room for another block (slots keep 16 bits of block index).
class TableFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShardTable {
 public:
  // max_blocks_per_stripe caps each stripe's row storage (clamped to 1..65536).
  ShardTable(uint32_t dim, uint64_t seed, float init_scale, uint32_t num_stripes = 16,
             uint32_t max_blocks_per_stripe = 65536);
  ShardTable(const ShardTable&) = delete;
  ShardTable& operator=(const ShardTable&) = delete;

  uint32_t dim() const { return dim_; }

  // Copies the rows of `keys` into out (n * dim floats, may be unaligned: it is usually a
  // reply buffer behind a protobuf header), and with `state_out` their accumulators (n
  // floats, may be unaligned); absent rows are computed with row_init (state 0) and NOT
  // inserted (a pull never grows the table).
  void gather(const int64_t* keys, size_t n, void* out, void* state_out = nullptr) const;

  // Applies one gradient row per key.  Keys must be unique (callers merge duplicates
  // first).  Absent rows are inserted with their first-touch values before the update.
  // All or nothing: every missing row is inserted before any row is updated, so a throw
  // (TableFull, std::bad_alloc) leaves every value as it was (only first-touch rows added,
  // which read the same as absent ones).  Waits while the table is frozen.
  void apply(const int64_t* keys, const float* grads, size_t n, float lr, OptimizerKind opt);

  // Calls fn(key) for every row, one stripe at a time under that stripe's lock (so pulls
  // and updates of other stripes go on).  fn must not call back into the table.
  template <class Fn>
  void for_each_key(Fn&& fn) const {
    for (const Stripe& st : stripes_) {
      std::lock_guard<std::mutex> lock(st.mu);
      for (const auto& entry : st.index) fn(entry.first);
    }
  }

  // While a Frozen lives nothing changes the table (apply and adopt wait; pulls go on,
  // they only read): what a checkpoint needs to write a consistent snapshot in pieces.
  class Frozen {
   public:
    explicit Frozen(std::shared_mutex& mu) : lock_(mu) {}

   private:
    std::unique_lock<std::shared_mutex> lock_;
  };
  Frozen freeze() const { return Frozen(update_mu_); }

  // Rows built aside from the live table, then swapped in at once: how a checkpoint is
  // loaded all or nothing.  stage_rows may throw (a duplicate key, TableFull, bad_alloc);
  // the live table is untouched until adopt(), which cannot fail.
  class Staged;
  std::unique_ptr<Staged> new_staged(size_t expected_rows) const;
  void stage_rows(Staged& st, const int64_t* keys, const float* values, const float* state,
                  size_t n) const;
  void adopt(Staged& st);  // the live rows become st's (and st holds the old ones)

  uint64_t rows() const;
  // Bytes held by rows, accumulators and index (capacity, not just what is in use).
  uint64_t bytes() const;

  // First-touch value of a whole row (the formula of hashing.h, hoisted per row).
  void init_row(int64_t key, float* out) const;

 private:
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  using Block = std::unique_ptr<float, FreeDeleter>;

  struct Stripe {
    mutable std::mutex mu;
    absl::flat_hash_map<int64_t, uint32_t> index;  // key -> (block << 16) | offset
    std::vector<Block> blocks;
    uint32_t used_in_last = 0;  // rows used in blocks.back()
  };

  static constexpr uint32_t kFirstBlockRows = 64;
  static constexpr uint32_t kMaxBlockRows = 16384;  // must stay <= 65536 (16-bit offset)

  static uint32_t block_rows(size_t block) {
    return block >= 8 ? kMaxBlockRows : (kFirstBlockRows << block);
  }
  uint32_t stripe_of(int64_t key) const;
  float* row_ptr(const Stripe& s, uint32_t slot) const;
  float* state_ptr(const Stripe& s, uint32_t slot) const;
  // Caller holds s.mu; key is absent.  Throws TableFull or std::bad_alloc.
  uint32_t insert_row(Stripe& s, int64_t key);
  // The next free slot of s (allocating a block when needed), not yet taken: the caller
  // takes it with ++s.used_in_last.  Throws TableFull or std::bad_alloc.
  uint32_t free_slot(Stripe& s) const;
  // order[] gets the indices 0..n-1 grouped by stripe; starts[s]..starts[s+1] is stripe s.
  void group_by_stripe(const int64_t* keys, size_t n, std::vector<uint32_t>& order,
                       std::vector<uint32_t>& starts) const;

  const uint32_t dim_;
  const uint64_t seed_;
  const float init_scale_;
  const uint32_t max_blocks_;
  std::vector<Stripe> stripes_;
  // Writers (apply: shared, adopt: exclusive) against a checkpoint's freeze (exclusive).
  // Taken before any stripe lock.
  mutable std::shared_mutex update_mu_;
};

class ShardTable::Staged {
 public:
  explicit Staged(size_t num_stripes) : stripes(num_stripes) {}
  size_t rows = 0;

 private:
  friend class ShardTable;
  std::vector<Stripe> stripes;
};

}  // namespace cpu_dist::ps
