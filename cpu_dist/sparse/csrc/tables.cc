#include "tables.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace cpu_dist::ps {

namespace {

using grpc::Status;
using grpc::StatusCode;

// The widest row a table may have (a Pull reply of one row must fit any message limit).
constexpr uint32_t kMaxDim = 1u << 16;
constexpr size_t kMaxNameBytes = 256;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// A step of at least this many rows over several tables, all in DRAM only, runs each pass on
// two threads (the tables dealt to the lighter one, by rows).  Its committer waits for the
// apply (a single worker has nothing else to do meanwhile), and the passes of two tables share
// nothing but what their own locks guard.  Tiered tables share the shard's byte budget, whose
// split reaches into other tables: they stay on one thread.
constexpr size_t kTwoThreadRows = 16384;

// Per update, 0 or 1: which thread runs it; all 0 when one thread should run them all.
std::vector<int> deal(const std::vector<const StepUpdate*>& order) {
  std::vector<int> lane(order.size(), 0);
  size_t rows = 0;
  for (const StepUpdate* u : order) {
    const TierOptions& t = u->table->tier_options();
    if (t.memory_rows != 0 || !t.ssd_dir.empty() || t.budget) return lane;
    rows += u->n;
  }
  if (order.size() < 2 || rows < kTwoThreadRows) return lane;
  std::vector<size_t> by_rows(order.size());
  for (size_t i = 0; i < order.size(); ++i) by_rows[i] = i;
  std::stable_sort(by_rows.begin(), by_rows.end(),
                   [&](size_t a, size_t b) { return order[a]->n > order[b]->n; });
  size_t load[2] = {0, 0};
  for (size_t i : by_rows) {
    const int to = load[1] < load[0] ? 1 : 0;
    lane[i] = to;
    load[to] += order[i]->n + 1;
  }
  return lane;
}

// f(i) for every update, update i on thread lane[i] (1: a helper this call joins); what each
// throws is kept in errors[i], in no thread's order.  With `stop_on_failure` (pass 1, where a
// failure cancels the step) neither thread starts another update once one has failed.
template <class F>
std::vector<std::exception_ptr> run_dealt(const std::vector<int>& lane, bool stop_on_failure,
                                          F&& f) {
  std::vector<std::exception_ptr> errors(lane.size());
  std::atomic<bool> failed{false};
  auto run = [&](int which) {
    for (size_t i = 0; i < lane.size(); ++i) {
      if (lane[i] != which) continue;
      if (stop_on_failure && failed.load()) return;
      try {
        f(i);
      } catch (...) {
        errors[i] = std::current_exception();
        failed.store(true);
      }
    }
  };
  if (std::find(lane.begin(), lane.end(), 1) == lane.end()) {
    run(0);
    return errors;
  }
  std::thread helper;
  try {
    helper = std::thread(run, 1);
  } catch (const std::system_error&) {  // no thread to be had: this one runs both halves
    run(0);
    run(1);
    return errors;
  }
  run(0);
  helper.join();
  return errors;
}

}  // namespace

std::string first_difference(const ShardTableSpec& have, const ShardTableSpec& want) {
  if (have.name != want.name) return "name";
  if (have.dim != want.dim) return "dim";
  if (have.flag_declared) {
    // Its optimizer is per request: any a flag table serves matches (Adagrad does not: its
    // state is dim floats a row, a flag table's one).
    if (want.optimizer == OptimizerKind::kAdagrad && !want.flag_declared) return "optimizer";
  } else if (have.optimizer != want.optimizer) {
    return "optimizer";
  }
  if (!same_bits(have.init_scale, want.init_scale)) return "init_scale";
  if (have.seed != want.seed) return "seed";
  if (have.num_embeddings != want.num_embeddings && !have.flag_declared) return "num_embeddings";
  if (have.admit_after != want.admit_after) return "admit_after";
  if (have.expire_after != want.expire_after) return "expire_after";
  if (!have.flag_declared && !same_bits(have.eps, want.eps)) return "eps";
  return {};
}

std::string spec_error(const ShardTableSpec& s) {
  const std::string who = absl::StrCat("table '", absl::CHexEscape(s.name.substr(0, 64)), "'");
  if (s.name.empty()) return "a table needs a name";
  if (s.name.size() > kMaxNameBytes)
    return absl::StrCat(who, ": name of ", s.name.size(), " bytes, more than ", kMaxNameBytes);
  for (char c : s.name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return absl::StrCat(who, ": the name has a control character");
  const int opt = static_cast<int>(s.optimizer);
  if (opt < 0 || opt > static_cast<int>(OptimizerKind::kAdagrad))
    return absl::StrCat(who, ": unknown optimizer ", opt);
  if (s.dim == 0 || s.dim > kMaxDim)
    return absl::StrCat(who, ": dim must be in 1..", kMaxDim, ", got ", s.dim);
  if (!std::isfinite(s.init_scale) || s.init_scale < 0)
    return absl::StrCat(who, ": init_scale must be finite and >= 0, got ", s.init_scale);
  if (s.optimizer == OptimizerKind::kAdagrad) {
    if (!std::isfinite(s.eps) || !(s.eps > 0))
      return absl::StrCat(who, ": eps must be finite and > 0 for adagrad, got ", s.eps);
  } else if (s.eps != 0.0f) {
    return absl::StrCat(who, ": eps is adagrad's only (0 for ", optimizer_name(s.optimizer),
                        "), got ", s.eps);
  }
  return {};
}

ShardTableSpec spec_from_proto(const TableSpec& m) {
  ShardTableSpec s;
  s.name = m.name();
  s.dim = m.dim();
  s.optimizer = static_cast<OptimizerKind>(m.optimizer());  // checked by spec_error
  s.init_scale = m.init_scale();
  s.seed = m.seed();
  s.num_embeddings = m.num_embeddings();
  s.admit_after = m.admit_after();
  s.expire_after = m.expire_after();
  s.eps = m.eps();
  return s;
}

void spec_to_proto(const ShardTableSpec& s, TableSpec* m) {
  m->set_name(s.name);
  m->set_dim(s.dim);
  m->set_optimizer(static_cast<Optimizer>(s.optimizer));
  m->set_init_scale(s.init_scale);
  m->set_seed(s.seed);
  m->set_num_embeddings(s.num_embeddings);
  m->set_admit_after(s.admit_after);
  m->set_expire_after(s.expire_after);
  m->set_eps(s.eps);
}

ShardTable* ShardTables::find(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : it->second.get();
}

ShardTable* ShardTables::first() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return tables_.empty() ? nullptr : tables_.begin()->second.get();
}

size_t ShardTables::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return tables_.size();
}

void ShardTables::for_each(
    const std::function<void(const ShardTableSpec&, ShardTable&)>& fn) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& [name, t] : tables_) fn(t->spec(), *t);
}

std::vector<ShardTable*> ShardTables::all() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<ShardTable*> out;
  out.reserve(tables_.size());
  for (const auto& [name, t] : tables_) out.push_back(t.get());
  return out;
}

Status ShardTables::create(const ShardTableSpec& spec, bool* created) {
  *created = false;
  if (const std::string why = spec_error(spec); !why.empty())
    return Status(StatusCode::INVALID_ARGUMENT, why);
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = tables_.find(spec.name);
  if (it != tables_.end()) {
    const ShardTableSpec& have = it->second->spec();
    const std::string field = first_difference(have, spec);
    if (field.empty()) return Status::OK;
    return Status(StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("table '", absl::CHexEscape(spec.name), "' exists on this shard ",
                               "with another ", field, " (",
                               have.flag_declared ? "declared by the shard's flags" : "created",
                               " before); refused, nothing changed"));
  }
  try {
    tables_.emplace(spec.name, make_locked(spec));
  } catch (const std::invalid_argument& e) {
    return Status(StatusCode::INVALID_ARGUMENT, e.what());
  }
  *created = true;
  return Status::OK;
}

std::unique_ptr<ShardTable> ShardTables::make_locked(const ShardTableSpec& spec) {
  TierOptions tiers = opts_.tiers;
  if (created_ > 0) tiers.ssd_name = absl::StrCat(tiers.ssd_name, "-t", created_);
  auto t = std::make_unique<ShardTable>(spec, opts_.stripes, opts_.max_blocks_per_stripe,
                                        std::move(tiers));
  t->set_test_hooks(hooks_);
  ++created_;
  return t;
}

Status ShardTables::build(const ShardTableSpec& spec, std::unique_ptr<ShardTable>* out) {
  if (const std::string why = spec_error(spec); !why.empty())
    return Status(StatusCode::INVALID_ARGUMENT, why);
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (tables_.count(spec.name) != 0)
    return Status(StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("table '", absl::CHexEscape(spec.name), "' exists on this shard"));
  try {
    *out = make_locked(spec);
  } catch (const std::invalid_argument& e) {
    return Status(StatusCode::INVALID_ARGUMENT, e.what());
  }
  return Status::OK;
}

Status ShardTables::add(std::vector<std::unique_ptr<ShardTable>>& tables) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (const auto& t : tables)
    if (tables_.count(t->spec().name) != 0)
      return Status(StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("table '", absl::CHexEscape(t->spec().name),
                                 "' was created on this shard meanwhile; nothing changed"));
  for (auto& t : tables) {
    const std::string name = t->spec().name;
    tables_.emplace(name, std::move(t));
  }
  tables.clear();
  return Status::OK;
}

void commit_tables_step(const std::vector<StepUpdate>& updates, int64_t step, bool wait) {
  if (updates.size() == 1) {  // one table: as before tables (its own errors, unchanged)
    const StepUpdate& u = updates[0];
    u.table->commit_step(u.keys, u.grads, u.n, u.lr, u.optimizer, step, wait);
    return;
  }
  std::vector<const StepUpdate*> order;
  order.reserve(updates.size());
  for (const StepUpdate& u : updates) order.push_back(&u);
  std::sort(order.begin(), order.end(), [](const StepUpdate* a, const StepUpdate* b) {
    return a->table->spec().name < b->table->spec().name;
  });
  std::vector<std::unique_lock<std::shared_mutex>> locks;
  locks.reserve(order.size());
  for (const StepUpdate* u : order) {
    locks.push_back(u->table->step_lock());
    lock_or_would_block(locks.back(), wait);  // a throw unlocks the ones taken
  }
  order[0]->table->test_reach(TestPoint::kStepLocked);  // test-only (test_hooks.h)
  const std::vector<int> lane = deal(order);
  // Pass 1 of every table (rows resident and pinned); any failure cancels the tables prepared,
  // so that no table takes the step; the first failure in name order of those tried is thrown.
  std::vector<ShardTable::PreparedStepPtr> prepared(order.size());
  std::vector<std::exception_ptr> failed = run_dealt(lane, true, [&](size_t i) {
    const StepUpdate* u = order[i];
    prepared[i] =
        u->table->prepare_step_locked(u->keys, u->grads, u->n, u->lr, u->optimizer, step, false);
  });
  const auto first = std::find_if(failed.begin(), failed.end(),
                                  [](const std::exception_ptr& e) { return e != nullptr; });
  if (first != failed.end()) {
    for (size_t i = 0; i < order.size(); ++i)
      if (prepared[i]) order[i]->table->cancel_step_locked(*prepared[i]);
    std::rethrow_exception(*first);
  }
  // Pass 2 of every table: cannot fail but in the SSD tier after the rows changed
  // (AppliedThenFailed: the step is in every table; the first such failure is reported).
  failed =
      run_dealt(lane, false, [&](size_t i) { order[i]->table->finish_step_locked(*prepared[i]); });
  for (size_t i = 0; i < order.size(); ++i) {
    if (!failed[i]) continue;
    try {
      std::rethrow_exception(failed[i]);
    } catch (const AppliedThenFailed& e) {
      throw AppliedThenFailed(
          absl::StrCat("table '", order[i]->table->spec().name, "': ", e.what()), e.no_space());
    }
  }
}

void push_tables(const std::vector<StepUpdate>& updates, bool wait) {
  std::vector<const StepUpdate*> order;
  order.reserve(updates.size());
  for (const StepUpdate& u : updates) order.push_back(&u);
  std::sort(order.begin(), order.end(), [](const StepUpdate* a, const StepUpdate* b) {
    return a->table->spec().name < b->table->spec().name;
  });
  std::vector<ShardTable::PushLock> locks;
  locks.reserve(order.size());
  for (const StepUpdate* u : order) {
    locks.push_back(u->table->push_lock());
    locks.back().lock(wait);  // a throw unlocks the ones taken
  }
  std::vector<ShardTable::PreparedStepPtr> prepared;
  prepared.reserve(order.size());
  try {
    for (const StepUpdate* u : order)
      prepared.push_back(
          u->table->prepare_push_locked(u->keys, u->grads, u->n, u->lr, u->optimizer));
  } catch (...) {
    for (size_t i = 0; i < prepared.size(); ++i) order[i]->table->cancel_push_locked(*prepared[i]);
    throw;
  }
  std::optional<AppliedThenFailed> after;  // the first table whose eviction failed
  for (size_t i = 0; i < order.size(); ++i) {
    const std::optional<TierError> e = order[i]->table->finish_push_locked(*prepared[i]);
    if (e && !after)
      after.emplace(absl::StrCat("table '", order[i]->table->spec().name,
                                 "': the push was applied, then the SSD tier failed evicting its "
                                 "rows (the DRAM tier is over its budget): ",
                                 e->what()),
                    e->no_space());
  }
  if (after) throw *after;
}

int64_t ShardTables::max_step() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t m = kNoStep;
  for (const auto& [name, t] : tables_) m = std::max(m, t->max_step());
  return m;
}

}  // namespace cpu_dist::ps
