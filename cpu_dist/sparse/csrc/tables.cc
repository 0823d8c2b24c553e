#include "tables.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
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
  // Pass 1 of every table (rows resident and pinned); any failure cancels the ones before it,
  // so that no table takes the step.
  std::vector<ShardTable::PreparedStepPtr> prepared;
  prepared.reserve(order.size());
  try {
    for (const StepUpdate* u : order)
      prepared.push_back(
          u->table->prepare_step_locked(u->keys, u->grads, u->n, u->lr, u->optimizer, step, false));
  } catch (...) {
    for (size_t i = 0; i < prepared.size(); ++i) order[i]->table->cancel_step_locked(*prepared[i]);
    throw;
  }
  // Pass 2 of every table: cannot fail but in the SSD tier after the rows changed
  // (AppliedThenFailed: the step is in every table; the first such failure is reported).
  std::optional<AppliedThenFailed> first_failure;
  for (size_t i = 0; i < order.size(); ++i) {
    try {
      order[i]->table->finish_step_locked(*prepared[i]);
    } catch (const AppliedThenFailed& e) {
      if (!first_failure)
        first_failure.emplace(
            absl::StrCat("table '", order[i]->table->spec().name, "': ", e.what()), e.no_space());
    }
  }
  if (first_failure) throw *first_failure;
}

int64_t ShardTables::max_step() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t m = kNoStep;
  for (const auto& [name, t] : tables_) m = std::max(m, t->max_step());
  return m;
}

}  // namespace cpu_dist::ps
