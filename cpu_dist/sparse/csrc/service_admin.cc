// PsService: administration (AbortSessions, Stats, Health, Dump, Shutdown, CreateTables).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "hashing.h"
#include "memory_budget.h"
#include "paging.h"
#include "service.h"
#include "status_util.h"
#include "wire.h"

namespace cpu_dist::ps {

using grpc::Status;
using grpc::StatusCode;

namespace {

uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE))
                  : 0;
}

// The process's peak resident set (VmHWM), in bytes; 0 when unknown.
uint64_t peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "VmHWM: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kb) * 1024;
}

}  // namespace

Status PsService::do_abort(AbortSessionsRequest&, BB* resp) {
  AbortSessionsResponse out;
  out.set_aborted(static_cast<uint32_t>(sessions_.abort_all()));
  wire::serialize(out, resp);
  return Status::OK;
}

StatsResponse PsService::stats() const {
  StatsResponse s;
  // Per table (name order), and the totals over them.
  uint64_t rows = 0, bytes = 0;
  TierStats sum;
  const ShardTable* first = tables_.first();
  tables_.for_each([&](const ShardTableSpec& spec, ShardTable& t) {
    const uint64_t r = t.rows(), b = t.bytes();
    const TierStats ts = t.tier_stats();
    TableStats* out = s.add_tables();
    out->set_name(spec.name);
    out->set_dim(spec.dim);
    out->set_rows(r);
    out->set_rows_dram(ts.rows_dram);
    out->set_rows_ssd(ts.rows_ssd);
    out->set_ssd_bytes(ts.ssd_bytes);
    out->set_rows_admitted(ts.rows_admitted);
    out->set_rows_expired(ts.rows_expired);
    out->set_bytes(b);
    out->set_blocks_ahead(ts.blocks_ahead);
    rows += r;
    bytes += b;
    sum.rows_dram += ts.rows_dram;
    sum.rows_ssd += ts.rows_ssd;
    sum.ssd_bytes += ts.ssd_bytes;
    sum.rows_admitted += ts.rows_admitted;
    sum.rows_expired += ts.rows_expired;
    sum.pending_counts += ts.pending_counts;
    sum.rows_read_ssd += ts.rows_read_ssd;
  });
  s.set_rows(rows);
  s.set_dim(first != nullptr ? first->dim() : 0);  // the first (or only) table's
  s.set_table_bytes(bytes);
  s.set_resident_bytes(resident_bytes());
  s.set_peak_resident_bytes(peak_resident_bytes());
  s.set_pull_calls(counters_.pull_calls.load());
  s.set_pull_keys(counters_.pull_keys.load());
  s.set_push_calls(counters_.push_calls.load());
  s.set_push_keys(counters_.push_keys.load());
  s.set_commit_calls(counters_.commit_calls.load());
  s.set_commit_keys(counters_.commit_keys.load());
  s.set_errors(counters_.errors.load());
  s.set_bytes_in(counters_.bytes_in.load());
  s.set_bytes_out(counters_.bytes_out.load());
  s.set_shard_index(opts_.shard_index);
  s.set_num_shards(opts_.num_shards);
  s.set_sessions(static_cast<uint32_t>(sessions_.live_sessions()));
  s.set_waiters(static_cast<uint32_t>(sessions_.waiters()));
  s.set_rows_dram(sum.rows_dram);
  s.set_rows_ssd(sum.rows_ssd);
  s.set_ssd_bytes(sum.ssd_bytes);
  s.set_rows_admitted(sum.rows_admitted);
  s.set_rows_expired(sum.rows_expired);
  s.set_pending_counts(sum.pending_counts);
  s.set_rows_read_ssd(sum.rows_read_ssd);
  const CommitSessions::Applies applies = sessions_.applies();
  s.set_applied_steps(applies.steps);
  s.set_apply_ns(applies.ns);
  return s;
}

Status PsService::do_stats(StatsRequest&, BB* resp) {
  wire::serialize(stats(), resp);
  return Status::OK;
}

Status PsService::do_health(HealthRequest&, BB* resp) {
  HealthResponse out;
  out.set_serving(true);
  out.set_shard_index(opts_.shard_index);
  out.set_num_shards(opts_.num_shards);
  uint64_t rows = 0;
  bool first = true;
  tables_.for_each([&](const ShardTableSpec& spec, ShardTable& t) {
    spec_to_proto(spec, out.add_tables());
    rows += t.rows();
    if (!std::exchange(first, false)) return;
    // The one-table fields: the first (or only) table's, as before tables.
    out.set_dim(spec.dim);
    out.set_table(spec.name);
    out.set_seed(spec.seed);
    out.set_init_scale(spec.init_scale);
    out.set_admit_after(spec.admit_after);
    out.set_expire_after(spec.expire_after);
  });
  out.set_rows(rows);
  wire::serialize(out, resp);
  return Status::OK;
}

// One page of one table: its keys are chosen in one pass (paging.h), then the reply is laid
// out and the rows are copied from the table straight into it.
Status PsService::do_dump(DumpRequest& r, BB* resp) {
  ShardTable* table = nullptr;
  PS_RETURN_IF_ERROR(find_table(r.table(), &table));
  if (r.partition() >= kNumPartitions)
    return invalid(absl::StrCat("partition ", r.partition(), " out of range (", kNumPartitions,
                                " partitions)"));
  const uint32_t dim = table->dim(), sw = table->state_floats();
  const uint64_t limit = static_cast<uint64_t>(opts_.max_message_bytes) - kDumpReplyOverhead;
  const uint64_t budget =
      std::min(r.max_bytes() == 0 ? kDefaultDumpPageBytes : r.max_bytes(), limit);
  const PageCursor from{r.partition(), r.after_key_set(), r.after_key()};
  const PageKeys page = select_page(*table, from, budget / dump_row_bytes(dim, sw));
  const size_t n = page.keys.size();
  DumpResponse head;
  head.set_done(page.done);
  if (!page.done) {
    head.set_next_partition(page.next.partition);
    head.set_next_after_key_set(page.next.after_key_set);
    head.set_next_after_key(page.next.after_key);
  }
  const auto where = wire::serialize_reserving<3>(
      head,
      {wire::Reserve{DumpResponse::kKeysFieldNumber, n * sizeof(int64_t)},
       wire::Reserve{DumpResponse::kValuesFieldNumber, n * dim * sizeof(float)},
       wire::Reserve{DumpResponse::kStateFieldNumber, n * sw * sizeof(float)}},
      resp);
  if (n == 0) return Status::OK;
  std::memcpy(where[0], page.keys.data(), n * sizeof(int64_t));
  table->read(page.keys.data(), n, where[1], where[2], nullptr);  // moves no row between tiers
  return Status::OK;
}

// Every spec is checked against the shard's tables (and the request's others) before any table
// is made, so a refused request creates none.
Status PsService::do_create_tables(CreateTablesRequest& r, BB* resp) {
  std::vector<ShardTableSpec> specs;
  specs.reserve(r.tables_size());
  for (const TableSpec& m : r.tables()) {
    ShardTableSpec spec = spec_from_proto(m);
    if (const std::string why = spec_error(spec); !why.empty()) return invalid(why);
    for (const ShardTableSpec& other : specs)
      if (other.name == spec.name)
        return invalid(absl::StrCat("table '", absl::CHexEscape(spec.name),
                                    "' is named twice in one CreateTables"));
    if (const ShardTable* have = tables_.find(spec.name); have != nullptr) {
      const std::string field = first_difference(have->spec(), spec);
      if (!field.empty())
        return Status(
            StatusCode::FAILED_PRECONDITION,
            absl::StrCat("table '", absl::CHexEscape(spec.name),
                         "' exists on this shard with another ", field,
                         have->spec().flag_declared ? " (declared by the shard's flags)" : "",
                         "; no table was created"));
    }
    specs.push_back(std::move(spec));
  }
  size_t num_tables = tables_.size();  // after this request
  for (const ShardTableSpec& spec : specs) num_tables += tables_.find(spec.name) == nullptr;
  if (const std::string why =
          budget_refusal(opts_.memory_rows, opts_.memory_bytes, !opts_.ssd_dir.empty(), num_tables);
      !why.empty())
    return Status(StatusCode::FAILED_PRECONDITION, absl::StrCat(why, "; no table was created"));
  CreateTablesResponse out;
  for (const ShardTableSpec& spec : specs) {
    bool created = false;
    PS_RETURN_IF_ERROR(tables_.create(spec, &created));
    if (created) {
      out.set_created(out.created() + 1);
    } else {
      out.set_existing(out.existing() + 1);
    }
  }
  wire::serialize(out, resp);
  return Status::OK;
}

Status PsService::do_shutdown(ShutdownRequest&, BB* resp) {
  wire::serialize(ShutdownResponse(), resp);
  on_shutdown_();
  return Status::OK;
}

}  // namespace cpu_dist::ps
