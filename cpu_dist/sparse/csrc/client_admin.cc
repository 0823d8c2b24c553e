// PsClient: sessions and administration, every one a typed call to every shard
// (call_every_shard).  Dumps are in client_dump.cc.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client.h"
#include "hashing.h"
#include "method_paths.h"
#include "optimizer.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

using paths::kAbortSessions;
using paths::kCloseSession;
using paths::kCreateTables;
using paths::kDump;
using paths::kHealth;
using paths::kLoad;
using paths::kSave;
using paths::kShutdown;
using paths::kStats;
using paths::kWaitCommitted;

// make_request for call_every_shard when every shard gets the same request.
auto same_for_every_shard(const google::protobuf::MessageLite& req) {
  return [&req](uint32_t) -> const google::protobuf::MessageLite& { return req; };
}

int64_t min_committed(const std::vector<WaitCommittedResponse>& replies) {
  int64_t lo = INT64_MAX;
  for (const auto& r : replies) lo = std::min(lo, r.committed_step());
  return lo;
}

}  // namespace

template <class Reply, class MakeRequest>
std::vector<Reply> PsClient::call_shards(const char* method, const std::vector<uint32_t>& shards,
                                         const MakeRequest& make_request, double timeout_s,
                                         const FailureHandler& on_failure) {
  Calls calls;
  std::vector<Reply> replies(shards.size());  // sized once: the decoders hold pointers into it
  for (size_t i = 0; i < shards.size(); ++i) {
    Call& c = add_call(calls, shards[i], 0, method);
    wire::serialize(make_request(shards[i]), &c.request);
    Reply* out = &replies[i];
    c.on_reply = [out](Call& call) {
      if (!wire::parse(call.response, out))
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat("malformed ", out->GetTypeName(), " from server"));
      return grpc::Status::OK;
    };
  }
  run_calls(calls, timeout_s);
  if (on_failure &&
      std::any_of(calls.begin(), calls.end(), [](const auto& c) { return !c->status.ok(); }))
    on_failure(calls);
  throw_first_failure(calls);
  return replies;
}

template <class Reply, class MakeRequest>
std::vector<Reply> PsClient::call_every_shard(const char* method, const MakeRequest& make_request,
                                              double timeout_s, const FailureHandler& on_failure) {
  std::vector<uint32_t> all(num_shards());
  for (uint32_t s = 0; s < num_shards(); ++s) all[s] = s;
  return call_shards<Reply>(method, all, make_request, timeout_s, on_failure);
}

// ---- sessions -------------------------------------------------------------------------------

int64_t PsClient::wait_committed(uint64_t session, int64_t step, double timeout_s) {
  WaitCommittedRequest req;
  req.set_session(session);
  req.set_step(step);
  using SteadyClock = std::chrono::steady_clock;
  const auto end = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                            std::chrono::duration<double>(timeout_s));
  auto timed_out = [&](const Calls& calls) {
    const Call* first_timeout = nullptr;
    for (const auto& c : calls) {
      if (c->status.ok()) continue;
      if (c->status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
        throw describe(*c);  // e.g. the session was closed: it never commits
      if (first_timeout == nullptr) first_timeout = c.get();
    }
    throw WaitTimeout(absl::StrCat("session ", session, " step ", step, " not committed within ",
                                   timeout_s, " s (", describe(*first_timeout).what(), ")"));
  };
  // A shard answers a long poll after ten minutes at most: poll again while time is left.
  for (;;) {
    const double left =
        std::max(0.0, std::chrono::duration<double>(end - SteadyClock::now()).count());
    const int64_t lo = min_committed(call_every_shard<WaitCommittedResponse>(
        kWaitCommitted, same_for_every_shard(req), left, timed_out));
    if (lo >= step) return lo;
    if (end - SteadyClock::now() < std::chrono::seconds(1))
      throw WaitTimeout(absl::StrCat("session ", session, " step ", step, " not committed within ",
                                     timeout_s, " s (committed step: ", lo, ")"));
  }
}

int64_t PsClient::committed_step(uint64_t session) {
  WaitCommittedRequest req;
  req.set_session(session);
  req.set_step(-1);  // always satisfied: answers at once
  return min_committed(call_every_shard<WaitCommittedResponse>(
      kWaitCommitted, same_for_every_shard(req), opts_.timeout_s));
}

void PsClient::close_session(uint64_t session, uint32_t rank) {
  CloseSessionRequest req;
  req.set_session(session);
  req.set_rank(rank);
  call_every_shard<CloseSessionResponse>(kCloseSession, same_for_every_shard(req), opts_.timeout_s);
}

std::vector<AbortSessionsResponse> PsClient::abort_sessions() {
  return call_every_shard<AbortSessionsResponse>(
      kAbortSessions, same_for_every_shard(AbortSessionsRequest()), opts_.timeout_s);
}

// ---- administration -------------------------------------------------------------------------

std::vector<StatsResponse> PsClient::stats() {
  return call_every_shard<StatsResponse>(kStats, same_for_every_shard(StatsRequest()),
                                         opts_.timeout_s);
}

std::vector<HealthResponse> PsClient::health() {
  return call_every_shard<HealthResponse>(kHealth, same_for_every_shard(HealthRequest()),
                                          opts_.timeout_s);
}

std::vector<CreateTablesResponse> PsClient::create_tables(const std::vector<TableSpec>& specs) {
  CreateTablesRequest req;
  for (const TableSpec& s : specs) *req.add_tables() = s;
  std::vector<CreateTablesResponse> replies = call_every_shard<CreateTablesResponse>(
      kCreateTables, same_for_every_shard(req), opts_.timeout_s);
  std::lock_guard<std::mutex> lock(widths_mu_);  // every shard holds them now
  for (const TableSpec& s : specs)
    state_widths_[s.name()] =
        state_floats(static_cast<OptimizerKind>(static_cast<int>(s.optimizer())), s.dim());
  return replies;
}

void PsClient::shutdown() {
  call_every_shard<ShutdownResponse>(kShutdown, same_for_every_shard(ShutdownRequest()),
                                     opts_.timeout_s);
}

std::vector<SaveResponse> PsClient::save(const std::vector<std::string>& paths, int64_t step,
                                         bool check_session, uint64_t session, int64_t session_step,
                                         double timeout_s) {
  if (paths.size() != num_shards())
    throw std::invalid_argument(absl::StrCat("save needs one path per shard: ", paths.size(),
                                             " paths for ", num_shards(), " shards"));
  SaveRequest req;
  req.set_table(opts_.table);
  req.set_step(step);
  req.set_check_session(check_session);
  req.set_session(session);
  req.set_session_step(session_step);
  return call_every_shard<SaveResponse>(
      kSave,
      [&](uint32_t s) {
        SaveRequest r = req;
        r.set_path(paths[s]);
        return r;
      },
      timeout_s);
}

std::vector<LoadResponse> PsClient::load(const std::vector<std::string>& paths,
                                         const std::vector<uint64_t>& sizes,
                                         const std::vector<uint32_t>& checksums, double timeout_s) {
  auto stage = [&](LoadStage st) {
    LoadRequest req;
    req.set_table(opts_.table);
    req.set_stage(st);
    if (st == LoadStage::LOAD || st == LoadStage::PREPARE) {  // COMMIT, ABORT: no files
      for (const auto& p : paths) req.add_paths(p);
      for (uint64_t b : sizes) req.add_sizes(b);
      for (uint32_t c : checksums) req.add_checksums(c);
    }
    return call_every_shard<LoadResponse>(kLoad, same_for_every_shard(req), timeout_s);
  };
  if (num_shards() == 1) return stage(LoadStage::LOAD);
  // All or nothing across shards: every shard reads and checks first, then all swap in.
  try {
    stage(LoadStage::PREPARE);
  } catch (const RpcError&) {
    try {
      stage(LoadStage::ABORT);
    } catch (const RpcError&) {  // the PREPARE error is the one to report
    }
    throw;
  }
  return stage(LoadStage::COMMIT);
}

// ---- dump pages (the pages' use is in client_dump.cc) ---------------------------------------

std::vector<DumpResponse> PsClient::dump_round(const std::vector<uint32_t>& shards,
                                               const std::vector<PageCursor>& from,
                                               uint64_t max_bytes, uint32_t table) {
  const ClientTable& t = opts_.tables.at(table);
  // The reply must fit the client's own receive limit.
  const uint64_t limit = static_cast<uint64_t>(opts_.max_message_bytes) - kDumpReplyOverhead;
  const uint64_t budget = std::min(max_bytes == 0 ? kDefaultDumpPageBytes : max_bytes, limit);
  std::vector<DumpResponse> pages = call_shards<DumpResponse>(
      kDump, shards,
      [&](uint32_t s) {
        const PageCursor& c = from[std::find(shards.begin(), shards.end(), s) - shards.begin()];
        DumpRequest r;
        r.set_table(t.name);
        r.set_partition(c.partition);
        r.set_after_key_set(c.after_key_set);
        r.set_after_key(c.after_key);
        r.set_max_bytes(budget);
        return r;
      },
      opts_.timeout_s);
  const size_t row_bytes = size_t{t.dim} * sizeof(float);
  for (size_t i = 0; i < pages.size(); ++i) {
    const DumpResponse& p = pages[i];
    const size_t n = p.keys().size() / sizeof(int64_t);
    const PageCursor& c = from[i];
    // The next page must start after this one's: a shard cannot make a dump loop forever.
    const bool advances = p.done() || p.next_partition() > c.partition ||
                          (p.next_partition() == c.partition && p.next_after_key_set() &&
                           (!c.after_key_set || p.next_after_key() > c.after_key));
    // State: one float per row, or dim (element-wise Adagrad).
    const bool state_ok =
        p.state().size() == n * sizeof(float) || p.state().size() == n * row_bytes;
    if (p.keys().size() % sizeof(int64_t) != 0 || p.values().size() != n * row_bytes || !state_ok ||
        !advances || p.next_partition() >= kNumPartitions)
      throw RpcError(absl::StrCat("shard ", shards[i], " (", shards_[shards[i]].address,
                                  "): malformed DumpResponse"),
                     shards[i], shards_[shards[i]].address);
  }
  return pages;
}

}  // namespace cpu_dist::ps
