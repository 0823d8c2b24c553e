// PsService: administration (AbortSessions, Stats, Health, Dump, Shutdown).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "hashing.h"
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
  s.set_rows(table_.rows());
  s.set_dim(opts_.dim);
  s.set_table_bytes(table_.bytes());
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
  const TierStats t = table_.tier_stats();
  s.set_rows_dram(t.rows_dram);
  s.set_rows_ssd(t.rows_ssd);
  s.set_ssd_bytes(t.ssd_bytes);
  s.set_rows_admitted(t.rows_admitted);
  s.set_rows_expired(t.rows_expired);
  s.set_pending_counts(t.pending_counts);
  s.set_rows_read_ssd(t.rows_read_ssd);
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
  out.set_dim(opts_.dim);
  out.set_table(opts_.table);
  out.set_seed(opts_.seed);
  out.set_init_scale(opts_.init_scale);
  out.set_rows(table_.rows());
  out.set_admit_after(opts_.admit_after);
  out.set_expire_after(opts_.expire_after);
  wire::serialize(out, resp);
  return Status::OK;
}

// One page: its keys are chosen in one pass (paging.h), then the reply is laid out and the
// rows are copied from the table straight into it.
Status PsService::do_dump(DumpRequest& r, BB* resp) {
  if (r.partition() >= kNumPartitions)
    return invalid(absl::StrCat("partition ", r.partition(), " out of range (", kNumPartitions,
                                " partitions)"));
  const uint64_t limit = static_cast<uint64_t>(opts_.max_message_bytes) - kDumpReplyOverhead;
  const uint64_t budget =
      std::min(r.max_bytes() == 0 ? kDefaultDumpPageBytes : r.max_bytes(), limit);
  const PageCursor from{r.partition(), r.after_key_set(), r.after_key()};
  const PageKeys page = select_page(table_, from, budget / dump_row_bytes(opts_.dim));
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
       wire::Reserve{DumpResponse::kValuesFieldNumber, n * opts_.dim * sizeof(float)},
       wire::Reserve{DumpResponse::kStateFieldNumber, n * sizeof(float)}},
      resp);
  if (n == 0) return Status::OK;
  std::memcpy(where[0], page.keys.data(), n * sizeof(int64_t));
  table_.read(page.keys.data(), n, where[1], where[2], nullptr);  // moves no row between tiers
  return Status::OK;
}

Status PsService::do_shutdown(ShutdownRequest&, BB* resp) {
  wire::serialize(ShutdownResponse(), resp);
  on_shutdown_();
  return Status::OK;
}

}  // namespace cpu_dist::ps
