// The tables of one shard (tables issue): named ShardTables, each built from its spec
// (table_spec.h), created at the shard's start (ServerOptions::tables, or the one table its
// flags declare) or later by the CreateTables RPC.  Tables are only ever added, never removed
// or replaced (a checkpoint load swaps a table's rows, not the table), so a ShardTable* found
// here stays valid for the shard's life and lookups need only a shared lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "grpcpp/support/status.h"
#include "ps.pb.h"
#include "table.h"
#include "table_spec.h"
#include "test_hooks.h"

namespace cpu_dist::ps {

// The first field in which two specs differ ("dim", "optimizer", ...; the wire's field names),
// empty when they are the same table.  A flag-declared `have` matches any optimizer a flag
// table serves (sgd, rowwise_adagrad) and takes the other's eps as its own (0).
std::string first_difference(const ShardTableSpec& have, const ShardTableSpec& want);
// Why a spec cannot be a table (empty: it can): the name, dim, init_scale, eps, ...
std::string spec_error(const ShardTableSpec& spec);
ShardTableSpec spec_from_proto(const TableSpec& m);
void spec_to_proto(const ShardTableSpec& s, TableSpec* m);

// How a shard builds its tables (ServerOptions): stripes, capacity, tiers.
struct TablesOptions {
  uint32_t stripes = 16;
  uint32_t max_blocks_per_stripe = 65536;
  TierOptions tiers;  // each table's (ssd_name gets the table's index appended)
};

// One table's share of a committed step or of a push: its summed rows (keys unique) and its
// lr, optimizer.
struct StepUpdate {
  ShardTable* table = nullptr;
  const int64_t* keys = nullptr;
  const float* grads = nullptr;
  size_t n = 0;
  float lr = 0.0f;
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

// Applies job step `step` to every table it names (a table without rows still runs its step
// rules: expiry counts job steps), all or nothing: every table's step lock is taken first, in
// name order (with wait false: WouldBlock, nothing changed, when one is taken), then every
// table's pass 1 (ShardTable::prepare_step_locked: rows resident and pinned, budgets checked);
// a failure there (MemoryFull, TableFull, TierError, bad_alloc) cancels the tables prepared
// before it and leaves every table unchanged.  Then every table's pass 2 and step rules: what
// fails there is the SSD tier after the rows changed (AppliedThenFailed: the step is in every
// table, the session fails), as for one table.  A large step over DRAM-only tables runs each
// pass on two threads, each table wholly on one (tables.cc: kTwoThreadRows).
void commit_tables_step(const std::vector<StepUpdate>& updates, int64_t step, bool wait);

// Applies a push over several tables (no step: no step rules), all or nothing across them, as
// commit_tables_step does a step: every table's push lock first, in name order (with wait
// false: WouldBlock, nothing changed, when one is taken), then every table's pass 1; a failure
// there cancels the tables prepared before it and leaves every table unchanged; then every
// pass 2.  An SSD failure while evicting after the rows changed throws AppliedThenFailed naming
// the table (the push is in every table).  Before this a push applied its tables one after the
// other, and a lock met at the second table re-ran the whole push on a thread that may wait:
// the first table took the push twice.
void push_tables(const std::vector<StepUpdate>& updates, bool wait);

class ShardTables {
 public:
  explicit ShardTables(TablesOptions opts, TestHooks* hooks = nullptr)
      : opts_(std::move(opts)), hooks_(hooks) {}
  ShardTables(const ShardTables&) = delete;
  ShardTables& operator=(const ShardTables&) = delete;

  // The table named `name`, or null.
  ShardTable* find(std::string_view name) const;
  // The first table in name order (the one a one-table shard holds), or null.
  ShardTable* first() const;
  size_t size() const;
  // fn(spec, table) for every table in name order, under a shared lock: fn must not create.
  void for_each(const std::function<void(const ShardTableSpec&, ShardTable&)>& fn) const;
  std::vector<ShardTable*> all() const;  // name order

  // Adds the table (*created = true), or finds the identical one (*created = false).
  // INVALID_ARGUMENT for a spec that is no table (spec_error); FAILED_PRECONDITION naming the
  // table and the first differing field for another spec of an existing name.  Throws what
  // building a table throws (an SSD tier that cannot be opened: TierError).
  grpc::Status create(const ShardTableSpec& spec, bool* created);
  // A table built as create() builds one, but not on the shard: a checkpoint load stages its
  // rows there and add()s it once every table of the load staged, so a load that fails leaves
  // no table behind.  Errors and throws as create()'s; FAILED_PRECONDITION for a name the
  // shard has.
  grpc::Status build(const ShardTableSpec& spec, std::unique_ptr<ShardTable>* out);
  // Puts tables build() made on the shard, all or none: FAILED_PRECONDITION naming the first
  // whose name the shard took since (then nothing changed and `tables` keeps them all).
  grpc::Status add(std::vector<std::unique_ptr<ShardTable>>& tables);

  // The highest job step any row of any table may hold (ShardTable::max_step).
  int64_t max_step() const;

 private:
  std::unique_ptr<ShardTable> make_locked(const ShardTableSpec& spec);  // mu_ held; throws

  const TablesOptions opts_;
  TestHooks* const hooks_;
  mutable std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<ShardTable>, std::less<>> tables_;
  uint32_t created_ = 0;  // tables made so far: the suffix of each one's SSD directory
};

}  // namespace cpu_dist::ps
