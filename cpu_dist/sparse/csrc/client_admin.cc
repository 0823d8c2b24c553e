// PsClient: sessions and administration, every one a typed call to every shard
// (call_every_shard), and the merge of per-shard dumps.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

constexpr const char* kWait = "/cpu_dist.ps.ParameterServer/WaitCommitted";
constexpr const char* kClose = "/cpu_dist.ps.ParameterServer/CloseSession";
constexpr const char* kStats = "/cpu_dist.ps.ParameterServer/Stats";
constexpr const char* kHealth = "/cpu_dist.ps.ParameterServer/Health";
constexpr const char* kDump = "/cpu_dist.ps.ParameterServer/Dump";
constexpr const char* kShutdown = "/cpu_dist.ps.ParameterServer/Shutdown";
constexpr const char* kSave = "/cpu_dist.ps.ParameterServer/Save";
constexpr const char* kLoad = "/cpu_dist.ps.ParameterServer/Load";

// make_request for call_every_shard when every shard gets the same request.
auto same_for_every_shard(const google::protobuf::MessageLite& req) {
  return [&req](uint32_t) -> const google::protobuf::MessageLite& { return req; };
}

int64_t min_committed(const std::vector<WaitCommittedResponse>& replies) {
  int64_t lo = INT64_MAX;
  for (const auto& r : replies) lo = std::min(lo, r.committed_step());
  return lo;
}

// Per-shard dumps (each sorted by key, keys disjoint) merged into one sorted by key.
TableDump merge_dumps(const std::vector<DumpResponse>& replies, uint32_t dim,
                      const std::vector<std::string>& addresses) {
  const size_t row_bytes = size_t{dim} * sizeof(float);
  struct Ref {
    int64_t key;
    uint32_t shard;
    uint32_t row;
  };
  std::vector<Ref> refs;
  for (uint32_t s = 0; s < replies.size(); ++s) {
    const DumpResponse& r = replies[s];
    const size_t n = r.keys().size() / sizeof(int64_t);
    if (r.values().size() != n * row_bytes || r.state().size() != n * sizeof(float))
      throw RpcError(absl::StrCat("shard ", s, " (", addresses[s], "): malformed DumpResponse"));
    for (uint32_t i = 0; i < n; ++i) {
      int64_t k;
      std::memcpy(&k, r.keys().data() + i * sizeof(int64_t), sizeof(k));
      refs.push_back({k, s, i});
    }
  }
  std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) { return a.key < b.key; });
  TableDump d;
  d.keys.resize(refs.size());
  d.values.resize(refs.size() * dim);
  d.state.resize(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    const DumpResponse& r = replies[refs[i].shard];
    d.keys[i] = refs[i].key;
    std::memcpy(&d.values[i * dim], r.values().data() + refs[i].row * row_bytes, row_bytes);
    std::memcpy(&d.state[i], r.state().data() + refs[i].row * sizeof(float), sizeof(float));
  }
  return d;
}

}  // namespace

template <class Reply, class MakeRequest>
std::vector<Reply> PsClient::call_every_shard(const char* method, const MakeRequest& make_request,
                                              double timeout_s, const FailureHandler& on_failure) {
  Calls calls;
  std::vector<Reply> replies(num_shards());  // sized once: the decoders hold pointers into it
  for (uint32_t s = 0; s < num_shards(); ++s) {
    Call& c = add_call(calls, s, 0, method);
    wire::serialize(make_request(s), &c.request);
    Reply* out = &replies[s];
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

template <class Request>
Request PsClient::with_token() const {
  Request r;
  r.set_token(opts_.token);
  return r;
}

// ---- sessions -------------------------------------------------------------------------------

int64_t PsClient::wait_committed(uint64_t session, int64_t step, double timeout_s) {
  auto req = with_token<WaitCommittedRequest>();
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
        throw RpcError(describe(*c));  // e.g. the session was closed: it never commits
      if (first_timeout == nullptr) first_timeout = c.get();
    }
    throw WaitTimeout(absl::StrCat("session ", session, " step ", step, " not committed within ",
                                   timeout_s, " s (", describe(*first_timeout), ")"));
  };
  // A shard answers a long poll after ten minutes at most: poll again while time is left.
  for (;;) {
    const double left =
        std::max(0.0, std::chrono::duration<double>(end - SteadyClock::now()).count());
    const int64_t lo = min_committed(
        call_every_shard<WaitCommittedResponse>(kWait, same_for_every_shard(req), left, timed_out));
    if (lo >= step) return lo;
    if (end - SteadyClock::now() < std::chrono::seconds(1))
      throw WaitTimeout(absl::StrCat("session ", session, " step ", step, " not committed within ",
                                     timeout_s, " s (committed step: ", lo, ")"));
  }
}

int64_t PsClient::committed_step(uint64_t session) {
  auto req = with_token<WaitCommittedRequest>();
  req.set_session(session);
  req.set_step(-1);  // always satisfied: answers at once
  return min_committed(
      call_every_shard<WaitCommittedResponse>(kWait, same_for_every_shard(req), opts_.timeout_s));
}

void PsClient::close_session(uint64_t session, uint32_t rank) {
  auto req = with_token<CloseSessionRequest>();
  req.set_session(session);
  req.set_rank(rank);
  call_every_shard<CloseSessionResponse>(kClose, same_for_every_shard(req), opts_.timeout_s);
}

// ---- administration -------------------------------------------------------------------------

std::vector<StatsResponse> PsClient::stats() {
  return call_every_shard<StatsResponse>(kStats, same_for_every_shard(with_token<StatsRequest>()),
                                         opts_.timeout_s);
}

std::vector<HealthResponse> PsClient::health() {
  return call_every_shard<HealthResponse>(
      kHealth, same_for_every_shard(with_token<HealthRequest>()), opts_.timeout_s);
}

void PsClient::shutdown() {
  call_every_shard<ShutdownResponse>(kShutdown, same_for_every_shard(with_token<ShutdownRequest>()),
                                     opts_.timeout_s);
}

TableDump PsClient::dump() {
  auto req = with_token<DumpRequest>();
  req.set_table(opts_.table);
  return merge_dumps(
      call_every_shard<DumpResponse>(kDump, same_for_every_shard(req), opts_.timeout_s), opts_.dim,
      opts_.addresses);
}

std::vector<SaveResponse> PsClient::save(const std::vector<std::string>& paths, int64_t step,
                                         bool check_session, uint64_t session, int64_t session_step,
                                         double timeout_s) {
  if (paths.size() != num_shards())
    throw std::invalid_argument(absl::StrCat("save needs one path per shard: ", paths.size(),
                                             " paths for ", num_shards(), " shards"));
  auto req = with_token<SaveRequest>();
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
    auto req = with_token<LoadRequest>();
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

}  // namespace cpu_dist::ps
