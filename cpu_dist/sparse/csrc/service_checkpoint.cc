// The service's checkpoint methods (Save, Load): paths confined to the shard's checkpoint
// directory, and Load's stages (checkpoint.h does the file work).
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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

// Format 2 files hold one table keyed like the default one, with one state float a row: the
// shard's only table (checkpoint format 3 holds several).
Status PsService::checkpoint_table(const std::string& name, ShardTable** out) const {
  PS_RETURN_IF_ERROR(find_table(name, out));
  const ShardTableSpec& spec = (*out)->spec();
  if (tables_.size() != 1 || spec.salt() != 0 || spec.state_floats() != 1)
    return Status(
        StatusCode::FAILED_PRECONDITION,
        absl::StrCat("checkpoint format 2 holds a shard's one table '", std::string(kDefaultTable),
                     "' with one state float a row; this shard holds ", tables_.size(),
                     " tables ('", spec.name, "': ", optimizer_name(spec.optimizer), ")"));
  return Status::OK;
}

Status PsService::do_save(SaveRequest& r, BB* resp) {
  std::string path;
  PS_RETURN_IF_ERROR(checkpoint_path(r.path(), &path));
  ShardTable* table = nullptr;
  PS_RETURN_IF_ERROR(checkpoint_table(r.table(), &table));
  // From here until the file is written no update lands (pulls are still served), so the
  // session check below holds for the whole write.
  const ShardTable::Frozen frozen = table->freeze();
  if (hooks_ != nullptr) hooks_->reach(TestPoint::kSaveFrozen);  // test-only (test_hooks.h)
  if (r.check_session()) {
    const int64_t committed = sessions_.committed(r.session());
    if (committed != r.session_step())
      return Status(StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("session ", r.session(), " has committed step ", committed,
                                 ", not ", r.session_step(), ": not at the step boundary"));
  }
  ckpt::ShardMeta meta{table->spec().name, table->dim(), opts_.shard_index, opts_.num_shards,
                       r.step()};
  ckpt::SaveResult res;
  try {
    res = ckpt::save_shard(*table, frozen, meta, path);
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
}

Status PsService::do_load(LoadRequest& r, BB* resp) {
  const LoadStage stage = r.stage();
  if (stage == LoadStage::ABORT || stage == LoadStage::COMMIT) return finish_load(stage, resp);
  if (stage != LoadStage::LOAD && stage != LoadStage::PREPARE)
    return invalid(absl::StrCat("unknown load stage ", static_cast<int>(stage)));
  return load_files(r, resp);
}

Status PsService::finish_load(LoadStage stage, BB* resp) {
  std::lock_guard<std::mutex> lock(load_mu_);
  std::unique_ptr<ckpt::LoadedRows> rows = std::move(prepared_);
  LoadResponse out;
  if (stage == LoadStage::COMMIT) {
    if (!rows) return Status(StatusCode::FAILED_PRECONDITION, "COMMIT without a PREPARE");
    if (sessions_.live_sessions() != 0)
      return Status(StatusCode::FAILED_PRECONDITION,
                    "a commit session is open: load a checkpoint before training starts");
    tables_.first()->adopt(*rows->staged);  // cannot fail (checkpoint_table: the one table)
    out.set_rows(rows->n);
    out.set_step(rows->step);
  }
  wire::serialize(out, resp);
  return Status::OK;
}

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
  ShardTable* table = nullptr;
  PS_RETURN_IF_ERROR(checkpoint_table(r.table(), &table));
  std::lock_guard<std::mutex> lock(load_mu_);  // one load at a time
  prepared_.reset();
  auto rows = std::make_unique<ckpt::LoadedRows>();
  try {
    *rows = ckpt::load_for_shard(files, table->spec().name, *table, opts_.shard_index,
                                 opts_.num_shards);
    if (r.stage() == LoadStage::LOAD) table->adopt(*rows->staged);
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
