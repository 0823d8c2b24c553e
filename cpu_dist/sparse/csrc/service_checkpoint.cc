// The service's checkpoint methods (Save, Load): paths confined to the shard's checkpoint
// directory, and Load's stages (checkpoint.h does the file work).
#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint.h"
#include "service.h"
#include "status_util.h"
#include "wire.h"

namespace cpu_dist::ps {

using grpc::Status;
using grpc::StatusCode;

// ---- checkpoints ----------------------------------------------------------------------

Status PsService::checkpoint_path(const std::string& rel, std::string* full) const {
  if (opts_.checkpoint_dir.empty())
    return Status(StatusCode::FAILED_PRECONDITION,
                  "this shard has no checkpoint directory (start it with one)");
  const auto refuse = [&rel] {
    return invalid(absl::StrCat("checkpoint path '", absl::CHexEscape(rel.substr(0, 1024)),
                                "' must be a relative path inside the checkpoint directory"));
  };
  if (rel.empty() || rel.size() > 1024 || rel.front() == '/' || rel.find('\0') != std::string::npos)
    return refuse();
  for (absl::string_view part : absl::StrSplit(rel, '/'))
    if (part.empty() || part == "." || part == "..") return refuse();
  *full = absl::StrCat(opts_.checkpoint_dir, "/", rel);
  return Status::OK;
}

namespace {

// A table's spec as a version 3 header records it, and back.
ckpt::TableFixed fixed_of(const ShardTableSpec& s) {
  ckpt::TableFixed f;
  f.dim = s.dim;
  f.optimizer = static_cast<uint32_t>(s.optimizer);
  f.state_floats = s.state_floats();
  f.init_scale = s.init_scale;
  f.eps = s.eps;
  f.admit_after = s.admit_after;
  f.expire_after = s.expire_after;
  f.seed = s.seed;
  f.num_embeddings = s.num_embeddings;
  f.salt = s.salt();
  f.flags = s.flag_declared ? ckpt::kFlagDeclared : 0;
  return f;
}

ShardTableSpec spec_of(const ckpt::TableHeader& t) {
  ShardTableSpec s;
  s.name = t.name;
  s.dim = t.fixed.dim;
  s.optimizer = static_cast<OptimizerKind>(t.fixed.optimizer);
  s.init_scale = t.fixed.init_scale;
  s.eps = t.fixed.eps;
  s.admit_after = t.fixed.admit_after;
  s.expire_after = t.fixed.expire_after;
  s.seed = t.fixed.seed;
  s.num_embeddings = t.fixed.num_embeddings;
  s.flag_declared = (t.fixed.flags & ckpt::kFlagDeclared) != 0;
  return s;
}

// The value of a spec's field (first_difference's names), for messages.
std::string field_value(const ShardTableSpec& s, const std::string& field) {
  if (field == "dim") return absl::StrCat(s.dim);
  if (field == "optimizer") return optimizer_name(s.optimizer);
  if (field == "init_scale") return absl::StrCat(s.init_scale);
  if (field == "seed") return absl::StrCat(s.seed);
  if (field == "num_embeddings") return absl::StrCat(s.num_embeddings);
  if (field == "admit_after") return absl::StrCat(s.admit_after);
  if (field == "expire_after") return absl::StrCat(s.expire_after);
  if (field == "eps") return absl::StrCat(s.eps);
  return "";
}

// fn() with every table frozen, taken in the order given (name order, as every update that
// spans tables takes them), so the file is one snapshot of all of them.
template <class Fn>
auto with_frozen(const std::vector<ShardTable*>& tables, size_t i, Fn&& fn) {
  if (i == tables.size()) return fn();
  const ShardTable::Frozen frozen = tables[i]->freeze();
  return with_frozen(tables, i + 1, fn);
}

}  // namespace

Status PsService::do_save(SaveRequest& r, BB* resp) {
  std::string path;
  PS_RETURN_IF_ERROR(checkpoint_path(r.path(), &path));
  const std::vector<ShardTable*> tables = tables_.all();  // name order
  // From here until the file is written no update lands on any table (pulls are still
  // served), so the session check below holds for the whole write.
  return with_frozen(tables, 0, [&]() -> Status {
    if (hooks_ != nullptr) hooks_->reach(TestPoint::kSaveFrozen);  // test-only (test_hooks.h)
    if (r.check_session()) {
      const int64_t committed = sessions_.committed(r.session());
      if (committed != r.session_step())
        return Status(StatusCode::FAILED_PRECONDITION,
                      absl::StrCat("session ", r.session(), " has committed step ", committed,
                                   ", not ", r.session_step(), ": not at the step boundary"));
    }
    std::vector<ckpt::TableToSave> to_save;
    for (ShardTable* t : tables) to_save.push_back({t->spec().name, fixed_of(t->spec()), t});
    const ckpt::ShardMeta meta{opts_.shard_index, opts_.num_shards, r.step()};
    ckpt::SaveResult res;
    try {
      res = ckpt::save_shard(to_save, meta, path);
    } catch (const ckpt::CheckpointError& e) {
      return Status(e.code(), e.what());
    } catch (const std::exception& e) {
      return Status(StatusCode::INTERNAL, absl::StrCat("checkpoint ", path, ": ", e.what()));
    }
    SaveResponse out;
    out.set_rows(res.rows);
    out.set_bytes(res.bytes);
    out.set_checksum(res.checksum);
    wire::serialize(out, resp);
    return Status::OK;
  });
}

Status PsService::do_load(LoadRequest& r, BB* resp) {
  const LoadStage stage = r.stage();
  if (stage == LoadStage::ABORT || stage == LoadStage::COMMIT) return finish_load(stage, resp);
  if (stage != LoadStage::LOAD && stage != LoadStage::PREPARE)
    return invalid(absl::StrCat("unknown load stage ", static_cast<int>(stage)));
  return load_files(r, resp);
}

namespace {

// Every table of a load adopts its staged rows: first the tables the load built (not on the
// shard yet), then they join the shard, then the shard's own tables adopt theirs (which
// cannot fail).  When the shard took one of the built tables' names since, nothing changed.
Status adopt_all(ShardTables& tables, ckpt::LoadedRows& rows) {
  std::vector<ckpt::StagedTable*> own;
  for (ckpt::StagedTable& t : rows.tables) {
    const bool built = std::any_of(rows.created.begin(), rows.created.end(),
                                   [&t](const auto& c) { return c.get() == t.table; });
    if (built)
      t.table->adopt(*t.staged);
    else
      own.push_back(&t);
  }
  PS_RETURN_IF_ERROR(tables.add(rows.created));
  for (ckpt::StagedTable* t : own) t->table->adopt(*t->staged);
  return Status::OK;
}

}  // namespace

Status PsService::finish_load(LoadStage stage, BB* resp) {
  std::lock_guard<std::mutex> lock(load_mu_);
  std::unique_ptr<ckpt::LoadedRows> rows = std::move(prepared_);
  LoadResponse out;
  if (stage == LoadStage::COMMIT) {
    if (!rows) return Status(StatusCode::FAILED_PRECONDITION, "COMMIT without a PREPARE");
    if (sessions_.live_sessions() != 0)
      return Status(StatusCode::FAILED_PRECONDITION,
                    "a commit session is open: load a checkpoint before training starts");
    PS_RETURN_IF_ERROR(adopt_all(tables_, *rows));
    out.set_rows(rows->n);
    out.set_step(rows->step);
  }
  wire::serialize(out, resp);
  return Status::OK;
}

// The table each of the checkpoint's tables loads into, after every table was checked: the
// live one, or for those the shard lacks one built aside with the file's spec (into
// `created`: it joins the shard when the load is adopted).  A version 3 table must be absent
// or have the identical spec; a version 1 or 2 file's one table must be there, with its dim
// and one state float a row.
namespace {

Status load_targets(ShardTables& tables, const ckpt::CheckpointFiles& ck,
                    std::vector<std::unique_ptr<ShardTable>>* created,
                    std::vector<ShardTable*>* out) {
  const std::string where = absl::StrCat("checkpoint ", ck.first_path(), ": ");
  std::vector<ShardTableSpec> missing;
  for (const ckpt::TableHeader& th : ck.tables()) {
    ShardTable* live = tables.find(th.name);
    out->push_back(live);  // null: built below
    if (ck.version() < 3) {
      if (live == nullptr) {
        std::vector<std::string> names;
        for (ShardTable* t : tables.all()) names.push_back(absl::StrCat("'", t->spec().name, "'"));
        return invalid(absl::StrCat(where, "holds table '", th.name, "', this shard serves ",
                                    names.empty() ? "no table" : absl::StrJoin(names, ", ")));
      }
      if (live->dim() != th.fixed.dim)
        return invalid(absl::StrCat(where, "rows of dim ", th.fixed.dim, ", the table's dim is ",
                                    live->dim()));
      if (live->state_floats() != 1)
        return Status(
            StatusCode::FAILED_PRECONDITION,
            absl::StrCat(where, "a format version ", ck.version(),
                         " file holds one optimizer state float a row; table '", th.name, "' is ",
                         optimizer_name(live->spec().optimizer), " with ", live->state_floats()));
      continue;
    }
    ShardTableSpec want = spec_of(th);
    if (live == nullptr) {
      const std::string bad = spec_error(want);
      if (!bad.empty())
        return Status(StatusCode::DATA_LOSS,
                      absl::StrCat(where, "table '", th.name, "': corrupt spec (", bad, ")"));
      missing.push_back(std::move(want));
      continue;
    }
    // A table the shard's flags declared serves either one-float optimizer: the file's
    // optimizer was only its default.
    const ShardTableSpec& have = live->spec();
    if (want.flag_declared && have.state_floats() == 1 && want.optimizer != OptimizerKind::kAdagrad)
      want.optimizer = have.optimizer;
    const std::string field = first_difference(have, want);
    if (!field.empty())
      return Status(
          StatusCode::FAILED_PRECONDITION,
          absl::StrCat(where, "table '", th.name, "' has ", field, " ", field_value(want, field),
                       " in the checkpoint, ", field_value(have, field), " on this shard"));
  }
  for (const ShardTableSpec& spec : missing) {
    std::unique_ptr<ShardTable> t;
    try {
      PS_RETURN_IF_ERROR(tables.build(spec, &t));
    } catch (const std::exception& e) {
      return Status(StatusCode::FAILED_PRECONDITION,
                    absl::StrCat(where, "cannot create table '", spec.name, "': ", e.what()));
    }
    created->push_back(std::move(t));
  }
  size_t next_built = 0;  // `missing` is in file order too
  for (ShardTable*& t : *out)
    if (t == nullptr) t = created->at(next_built++).get();
  return Status::OK;
}

}  // namespace

Status PsService::load_files(LoadRequest& r, BB* resp) {
  const int n = r.paths_size();
  if (n == 0) return invalid("no checkpoint files to load");
  const bool checked = r.sizes_size() != 0 || r.checksums_size() != 0;
  if (checked && (r.sizes_size() != n || r.checksums_size() != n))
    return invalid(absl::StrCat(n, " paths but ", r.sizes_size(), " sizes and ", r.checksums_size(),
                                " checksums"));
  std::vector<ckpt::FileSpec> files(n);
  for (int i = 0; i < n; ++i) {
    PS_RETURN_IF_ERROR(checkpoint_path(r.paths(i), &files[i].path));
    if (checked) {
      if (r.sizes(i) == 0) return invalid(absl::StrCat("size 0 for ", r.paths(i)));
      files[i].bytes = r.sizes(i);
      files[i].checksum = r.checksums(i);
    }
  }
  if (sessions_.live_sessions() != 0)
    return Status(StatusCode::FAILED_PRECONDITION,
                  "a commit session is open: load a checkpoint before training starts");
  std::lock_guard<std::mutex> lock(load_mu_);  // one load at a time
  prepared_.reset();
  auto rows = std::make_unique<ckpt::LoadedRows>();
  try {
    const ckpt::CheckpointFiles ck(std::move(files), opts_.shard_index, opts_.num_shards);
    std::vector<ShardTable*> targets;
    PS_RETURN_IF_ERROR(load_targets(tables_, ck, &rows->created, &targets));
    rows->step = ck.step();
    for (size_t t = 0; t < targets.size(); ++t) {
      rows->tables.push_back(ck.stage(t, *targets[t]));
      rows->n += rows->tables.back().n;
    }
    if (r.stage() == LoadStage::LOAD) PS_RETURN_IF_ERROR(adopt_all(tables_, *rows));
  } catch (const ckpt::CheckpointError& e) {
    return Status(e.code(), e.what());
  } catch (const std::exception& e) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, absl::StrCat("checkpoint: ", e.what()));
  }
  LoadResponse out;
  out.set_rows(rows->n);
  out.set_step(rows->step);
  if (r.stage() == LoadStage::PREPARE) prepared_ = std::move(rows);
  wire::serialize(out, resp);
  return Status::OK;
}

}  // namespace cpu_dist::ps
