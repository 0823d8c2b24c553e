// The DRAM budget of one shard, in bytes, shared by every table of the shard
// (--ps-memory-bytes).  Rows of different tables have different widths, so the budget counts
// bytes: a row in DRAM costs ShardTable::row_bytes(), its values, its optimizer state, its key,
// its last-update step and flags (its slot, table.h) and its entry in the key index.  The rows
// over the budget live in each table's own SSD tier (tier_store.h: one RocksDB per table).
//
// How the bytes are split: each table's share is proportional to the bytes of all its rows
// (DRAM and SSD), so every table keeps the same fraction of its rows in DRAM, as HugeCTR's
// hierarchical parameter server's per-table cache ratio does; within a table CLOCK picks which
// rows stay (table.h).  A share is a row cap per stripe, the mechanism of --ps-memory-rows, so
// a tiny budget works like a tiny row cap: a step pins the rows it updates and writes those
// over the cap to SSD ahead of the update; the bits are those of an all-DRAM shard.  The split
// is redone (rebalance) when a table was created, and after an update that changed a table's
// row count by more than a sixteenth since the last split; then every table over its new cap
// evicts (a table a checkpoint has frozen evicts at the next split after the freeze: until
// then the shard may hold more than the budget).  Between splits a growing table evicts its
// own rows, never another table's.
//
// Without an SSD tier there is nowhere to evict to: a byte budget needs one (server.cc).
// --ps-memory-rows (TierOptions::memory_rows) stays the budget of a one-table shard, in rows;
// it cannot be split over tables of different widths (budget_refusal).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tier_store.h"

namespace cpu_dist::ps {

class ShardTable;

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t bytes) : bytes_(bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  uint64_t bytes() const { return bytes_; }

  // A table joins (from its constructor, once it can serve) or leaves (from its destructor).
  // attach() splits the budget again, so that the new table has its share.
  void attach(ShardTable* table);
  void detach(ShardTable* table);

  // Splits the budget over the tables by their rows' bytes, sets every table's row caps and
  // evicts what is over them.  Returns the first SSD failure of an eviction (nullopt: none;
  // the table that failed keeps its rows, over its cap, until the next split).  Called with no
  // stripe lock held; takes each table's stripe locks one at a time, never an update lock.
  std::optional<TierError> rebalance();
  // The same, from an update of `held`, whose update lock the caller holds.
  std::optional<TierError> rebalance_from(ShardTable* held);

  // Bytes of the rows now in DRAM, over every table.
  uint64_t used_bytes() const;

 private:
  std::optional<TierError> split_locked(ShardTable* held);

  const uint64_t bytes_;
  mutable std::mutex mu_;  // tables_ and every split
  std::vector<ShardTable*> tables_;
};

// Why a shard cannot have these budget options (empty: it can): one source for the start-up
// check (server.cc) and CreateTables.
inline std::string budget_refusal(uint64_t memory_rows, uint64_t memory_bytes, bool ssd_tier,
                                  size_t num_tables) {
  if (memory_rows > 0 && memory_bytes > 0)
    return "memory_rows (--ps-memory-rows) and memory_bytes (--ps-memory-bytes) are two budgets "
           "of one DRAM tier: give one";
  if (memory_bytes > 0 && !ssd_tier)
    return absl::StrCat("memory_bytes ", memory_bytes,
                        " (--ps-memory-bytes) needs an SSD tier (ssd_dir, --ps-ssd-dir) to evict "
                        "the rows over it to");
  if (memory_rows > 0 && num_tables > 1)
    return absl::StrCat("memory_rows (--ps-memory-rows) counts rows of one width; this shard has ",
                        num_tables,
                        " tables: give the DRAM budget in bytes (memory_bytes, --ps-memory-bytes)");
  return {};
}

}  // namespace cpu_dist::ps
