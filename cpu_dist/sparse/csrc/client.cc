#include "client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "hashing.h"
#include "malloc_tuning.h"
#include "merge.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

constexpr const char* kPull = "/cpu_dist.ps.ParameterServer/Pull";
constexpr const char* kPush = "/cpu_dist.ps.ParameterServer/Push";
constexpr const char* kCommit = "/cpu_dist.ps.ParameterServer/Commit";
constexpr const char* kWait = "/cpu_dist.ps.ParameterServer/WaitCommitted";
constexpr const char* kClose = "/cpu_dist.ps.ParameterServer/CloseSession";
constexpr const char* kStats = "/cpu_dist.ps.ParameterServer/Stats";
constexpr const char* kHealth = "/cpu_dist.ps.ParameterServer/Health";
constexpr const char* kDump = "/cpu_dist.ps.ParameterServer/Dump";
constexpr const char* kShutdown = "/cpu_dist.ps.ParameterServer/Shutdown";
constexpr const char* kSave = "/cpu_dist.ps.ParameterServer/Save";
constexpr const char* kLoad = "/cpu_dist.ps.ParameterServer/Load";

// Per-shard requests of at least this many keys per part are split over channels
// (PLATFORM.md: 2 parts help at 4096 keys; small pulls gain nothing).
constexpr size_t kSplitMinKeys = 1024;

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN";
  }
}

// Row-count arguments index with uint32_t (positions, slot ids): refuse what would wrap.
void check_count(size_t n) {
  if (n > UINT32_MAX)
    throw std::invalid_argument(absl::StrCat(n, " keys in one call: at most ", UINT32_MAX,
                                             " are supported"));
}

std::chrono::system_clock::time_point deadline_in(double s) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(s));
}

Optimizer to_proto(OptimizerKind k) {
  return k == OptimizerKind::kSgd ? Optimizer::SGD : Optimizer::ROWWISE_ADAGRAD;
}

template <class Msg>
std::function<grpc::Status(Call&)> parse_into(Msg* out) {
  return [out](Call& c) {
    if (!wire::parse(c.response, out))
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("malformed ", out->GetTypeName(), " from server"));
    return grpc::Status::OK;
  };
}

}  // namespace

// ---- AsyncOp ----------------------------------------------------------------------------

AsyncOp::AsyncOp(Calls calls, std::function<std::string(const Call&)> describe)
    : calls_(std::move(calls)), remaining_(calls_.size()), describe_(std::move(describe)) {
  for (auto& c : calls_) c->op = this;
}

bool AsyncOp::finish_call(Call* c) {
  if (c->status.ok() && c->on_reply) c->status = c->on_reply(*c);
  std::lock_guard<std::mutex> lock(mu_);
  if (--remaining_ > 0) return false;
  for (const auto& call : calls_)
    if (!call->status.ok()) {
      error_ = describe_(*call);
      break;
    }
  cv_.notify_all();
  return true;
}

bool AsyncOp::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [this] { return remaining_ == 0; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                      [this] { return remaining_ == 0; });
}

bool AsyncOp::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return remaining_ == 0;
}

std::string AsyncOp::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// ---- PsClient: plumbing -----------------------------------------------------------------

PsClient::PsClient(ClientOptions opts) : opts_(std::move(opts)) {
  if (opts_.addresses.empty()) throw std::invalid_argument("addresses must not be empty");
  if (opts_.dim == 0) throw std::invalid_argument("dim must be >= 1");
  if (opts_.max_keys_per_rpc == 0) throw std::invalid_argument("max_keys_per_rpc must be >= 1");
  if (opts_.channels_per_shard == 0)
    throw std::invalid_argument("channels_per_shard must be >= 1");
  if (!(opts_.timeout_s > 0)) throw std::invalid_argument("timeout_s must be > 0");
  // One RPC of max_keys_per_rpc keys (a push/commit request, or a pull reply) must fit in
  // max_message_bytes, with room for the small header fields.
  const uint64_t per_key = sizeof(int64_t) + static_cast<uint64_t>(opts_.dim) * sizeof(float);
  const uint64_t rpc_bytes = static_cast<uint64_t>(opts_.max_keys_per_rpc) * per_key + 1024;
  if (rpc_bytes > static_cast<uint64_t>(std::max(opts_.max_message_bytes, 0)))
    throw std::invalid_argument(absl::StrCat(
        "max_keys_per_rpc ", opts_.max_keys_per_rpc, " at dim ", opts_.dim, " needs RPCs of ",
        rpc_bytes, " bytes, more than max_message_bytes ", opts_.max_message_bytes));
  tune_malloc_once();
  for (const std::string& addr : opts_.addresses) {
    Shard s;
    s.address = addr;
    for (uint32_t j = 0; j < opts_.channels_per_shard; ++j) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(opts_.max_message_bytes);
      args.SetMaxSendMessageSize(opts_.max_message_bytes);
      // A private subchannel pool and a distinct argument: one TCP connection per channel.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("cpu_dist.channel_index", static_cast<int>(j));
      auto ch = grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
      s.stubs.push_back(std::make_unique<grpc::GenericStub>(ch));
      s.channels.push_back(std::move(ch));
    }
    shards_.push_back(std::move(s));
  }
  async_thread_ = std::thread([this] { async_loop(); });
}

PsClient::~PsClient() { close(); }

void PsClient::close() {
  std::lock_guard<std::mutex> serial(close_mu_);
  {
    // In-flight async operations end by their deadlines at the latest.
    std::unique_lock<std::mutex> lock(pending_mu_);
    if (closed_) return;
    closed_ = true;  // run_async refuses from here on, so pending_ only shrinks
    pending_cv_.wait(lock, [this] { return pending_.empty(); });
  }
  async_cq_.Shutdown();
  if (async_thread_.joinable()) async_thread_.join();
}

std::string PsClient::describe(const Call& c) const {
  return absl::StrCat("shard ", c.shard, " (", shards_[c.shard].address,
                      "): ", code_name(c.status.error_code()), ": ", c.status.error_message());
}

Call& PsClient::add_call(Calls& calls, uint32_t shard, uint32_t channel, const char* method) {
  auto c = std::make_unique<Call>();
  c->shard = shard;
  c->channel = channel % opts_.channels_per_shard;
  c->method = method;
  calls.push_back(std::move(c));
  return *calls.back();
}

size_t PsClient::parts_for(size_t m) const {
  size_t parts = (m + opts_.max_keys_per_rpc - 1) / opts_.max_keys_per_rpc;
  parts = std::max(parts, std::min<size_t>(opts_.channels_per_shard, m / kSplitMinKeys));
  return std::max<size_t>(parts, 1);
}

void PsClient::run(Calls& calls, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (closed_) throw std::runtime_error("client is closed");
  }
  grpc::CompletionQueue cq;
  const auto deadline = deadline_in(timeout_s);
  for (auto& c : calls) {
    c->ctx.set_deadline(deadline);
    c->reader = shards_[c->shard].stubs[c->channel]->PrepareUnaryCall(&c->ctx, c->method,
                                                                      c->request, &cq);
    c->reader->StartCall();
    c->reader->Finish(&c->response, &c->status, c.get());
  }
  for (size_t left = calls.size(); left > 0; --left) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    Call* c = static_cast<Call*>(tag);
    if (c->status.ok() && c->on_reply) c->status = c->on_reply(*c);  // decode while others fly
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  for (auto& c : calls)
    if (!c->status.ok()) throw RpcError(describe(*c));
}

std::shared_ptr<AsyncOp> PsClient::run_async(Calls calls) {
  auto op = std::make_shared<AsyncOp>(std::move(calls),
                                      [this](const Call& c) { return describe(c); });
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (closed_) throw std::runtime_error("client is closed");
    if (op->calls().empty()) return op;
    pending_.emplace(op.get(), op);
  }
  const auto deadline = deadline_in(opts_.timeout_s);
  for (auto& c : op->calls()) {
    c->ctx.set_deadline(deadline);
    c->reader = shards_[c->shard].stubs[c->channel]->PrepareUnaryCall(&c->ctx, c->method,
                                                                      c->request, &async_cq_);
    c->reader->StartCall();
    c->reader->Finish(&c->response, &c->status, c.get());
  }
  return op;
}

void PsClient::async_loop() {
  void* tag = nullptr;
  bool ok = false;
  while (async_cq_.Next(&tag, &ok)) {
    Call* c = static_cast<Call*>(tag);
    AsyncOp* op = c->op;
    if (op->finish_call(c)) {
      std::shared_ptr<AsyncOp> last;  // may be the final reference: release outside the lock
      {
        std::lock_guard<std::mutex> lock(pending_mu_);
        auto it = pending_.find(op);
        last = std::move(it->second);
        pending_.erase(it);
        pending_cv_.notify_all();
      }
    }
  }
}

void PsClient::raise_if_failed(AsyncOp& op) {
  std::string err = op.error();
  if (!err.empty()) throw RpcError(err);
}

// ---- pull -------------------------------------------------------------------------------

void PsClient::pull(const int64_t* keys, size_t n, float* out) {
  check_count(n);
  if (n == 0) return;
  const uint32_t dim = opts_.dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);

  // Deduplicate: unique u -> first position of its key in `keys`.
  absl::flat_hash_map<int64_t, uint32_t> index;
  index.reserve(n);
  std::vector<uint32_t> first;
  first.reserve(n);
  std::vector<uint32_t> uid(n);
  bool dups = false;
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = index.try_emplace(keys[i], static_cast<uint32_t>(first.size()));
    if (inserted) {
      first.push_back(static_cast<uint32_t>(i));
    } else {
      dups = true;
    }
    uid[i] = it->second;
  }

  // Group the unique keys by shard (positions into `keys`).
  const uint32_t ns = num_shards();
  std::vector<std::vector<uint32_t>> by_shard(ns);
  if (ns == 1) {
    by_shard[0] = first;
  } else {
    for (uint32_t pos : first) by_shard[shard_of(keys[pos], ns)].push_back(pos);
  }

  PullRequest head;
  head.set_token(opts_.token);
  head.set_table(opts_.table);
  head.set_dim(dim);
  Calls calls;
  const uint32_t base = next_channel_base();
  for (uint32_t s = 0; s < ns; ++s) {
    const std::vector<uint32_t>& pos = by_shard[s];
    const size_t m = pos.size();
    if (m == 0) continue;
    const size_t parts = parts_for(m);
    for (size_t p = 0; p < parts; ++p) {
      const size_t b = m * p / parts, e = m * (p + 1) / parts;
      Call& c = add_call(calls, s, base + static_cast<uint32_t>(p), kPull);
      auto where = wire::serialize_reserving<1>(
          head, {wire::Reserve{4, (e - b) * sizeof(int64_t)}}, &c.request);
      for (size_t j = b; j < e; ++j)
        std::memcpy(where[0] + (j - b) * sizeof(int64_t), &keys[pos[j]], sizeof(int64_t));
      const uint32_t* rows = pos.data() + b;
      const size_t count = e - b;
      c.on_reply = [rows, count, out, dim, row_bytes](Call& call) {
        wire::SliceReader r(call.response);
        uint8_t tag = 0;
        uint64_t len = 0;
        if (!r.read(&tag, 1) || tag != 0x0A || !r.read_varint(&len) ||
            len != count * row_bytes || r.remaining() != len)
          return grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("malformed PullResponse: expected ", count,
                                           " rows of dim ", dim));
        for (size_t j = 0; j < count; ++j)
          r.read(out + static_cast<size_t>(rows[j]) * dim, row_bytes);
        return grpc::Status::OK;
      };
    }
  }
  run(calls, opts_.timeout_s);
  if (dups)
    for (size_t i = 0; i < n; ++i) {
      const uint32_t f = first[uid[i]];
      if (f != i) std::memcpy(out + i * dim, out + static_cast<size_t>(f) * dim, row_bytes);
    }
}

// ---- push / commit ----------------------------------------------------------------------

Calls PsClient::build_push(const int64_t* keys, const float* grads, size_t n, float lr,
                           OptimizerKind opt) {
  check_count(n);
  const uint32_t dim = opts_.dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  // Merge duplicates here (in order) so that splitting never applies a key twice.
  RowAccumulator acc(dim);
  acc.reserve(n);
  acc.add(keys, grads, n);
  const std::vector<int64_t>& k = acc.keys();
  const float* g = acc.sums().data();
  const uint32_t ns = num_shards();
  std::vector<std::vector<uint32_t>> by_shard(ns);
  for (uint32_t i = 0; i < k.size(); ++i) by_shard[ns == 1 ? 0 : shard_of(k[i], ns)].push_back(i);

  PushRequest head;
  head.set_token(opts_.token);
  head.set_table(opts_.table);
  head.set_dim(dim);
  head.set_lr(lr);
  head.set_optimizer(to_proto(opt));
  Calls calls;
  const uint32_t base = next_channel_base();
  for (uint32_t s = 0; s < ns; ++s) {
    const std::vector<uint32_t>& idx = by_shard[s];
    const size_t m = idx.size();
    if (m == 0) continue;
    const size_t parts = parts_for(m);
    for (size_t p = 0; p < parts; ++p) {
      const size_t b = m * p / parts, e = m * (p + 1) / parts;
      Call& c = add_call(calls, s, base + static_cast<uint32_t>(p), kPush);
      auto where = wire::serialize_reserving<2>(
          head,
          {wire::Reserve{4, (e - b) * sizeof(int64_t)}, wire::Reserve{5, (e - b) * row_bytes}},
          &c.request);
      for (size_t j = b; j < e; ++j) {
        std::memcpy(where[0] + (j - b) * sizeof(int64_t), &k[idx[j]], sizeof(int64_t));
        std::memcpy(where[1] + (j - b) * row_bytes, g + static_cast<size_t>(idx[j]) * dim,
                    row_bytes);
      }
    }
  }
  return calls;
}

void PsClient::push(const int64_t* keys, const float* grads, size_t n, float lr,
                    OptimizerKind opt) {
  Calls calls = build_push(keys, grads, n, lr, opt);
  run(calls, opts_.timeout_s);
}

std::shared_ptr<AsyncOp> PsClient::push_async(const int64_t* keys, const float* grads,
                                              size_t n, float lr, OptimizerKind opt) {
  return run_async(build_push(keys, grads, n, lr, opt));
}

Calls PsClient::build_commit(uint64_t session, int64_t step, uint32_t rank,
                             uint32_t world_size, const int64_t* keys, const float* grads,
                             size_t n, float lr, OptimizerKind opt) {
  check_count(n);
  const uint32_t dim = opts_.dim;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  const uint32_t ns = num_shards();
  // No merging: the shard sums per key in rank then chunk order, which is input order.
  std::vector<std::vector<uint32_t>> by_shard(ns);
  for (uint32_t i = 0; i < n; ++i) by_shard[ns == 1 ? 0 : shard_of(keys[i], ns)].push_back(i);
  Calls calls;
  const uint32_t base = next_channel_base();
  for (uint32_t s = 0; s < ns; ++s) {
    const std::vector<uint32_t>& idx = by_shard[s];
    const size_t m = idx.size();
    // Every shard hears from every rank, if only an empty marker chunk.
    const size_t chunks = std::max<size_t>(1, (m + opts_.max_keys_per_rpc - 1) /
                                                  opts_.max_keys_per_rpc);
    for (size_t p = 0; p < chunks; ++p) {
      const size_t b = m * p / chunks, e = m * (p + 1) / chunks;
      CommitRequest head;
      head.set_token(opts_.token);
      head.set_table(opts_.table);
      head.set_session(session);
      head.set_step(step);
      head.set_rank(rank);
      head.set_world_size(world_size);
      head.set_chunk_index(static_cast<uint32_t>(p));
      head.set_chunk_count(static_cast<uint32_t>(chunks));
      head.set_dim(dim);
      head.set_lr(lr);
      head.set_optimizer(to_proto(opt));
      Call& c = add_call(calls, s, base + static_cast<uint32_t>(p), kCommit);
      auto where = wire::serialize_reserving<2>(
          head,
          {wire::Reserve{12, (e - b) * sizeof(int64_t)}, wire::Reserve{13, (e - b) * row_bytes}},
          &c.request);
      for (size_t j = b; j < e; ++j) {
        std::memcpy(where[0] + (j - b) * sizeof(int64_t), &keys[idx[j]], sizeof(int64_t));
        std::memcpy(where[1] + (j - b) * row_bytes, grads + static_cast<size_t>(idx[j]) * dim,
                    row_bytes);
      }
    }
  }
  return calls;
}

void PsClient::commit(uint64_t session, int64_t step, uint32_t rank, uint32_t world_size,
                      const int64_t* keys, const float* grads, size_t n, float lr,
                      OptimizerKind opt) {
  Calls calls = build_commit(session, step, rank, world_size, keys, grads, n, lr, opt);
  run(calls, opts_.timeout_s);
}

std::shared_ptr<AsyncOp> PsClient::commit_async(uint64_t session, int64_t step, uint32_t rank,
                                                uint32_t world_size, const int64_t* keys,
                                                const float* grads, size_t n, float lr,
                                                OptimizerKind opt) {
  return run_async(build_commit(session, step, rank, world_size, keys, grads, n, lr, opt));
}

// ---- sessions and administration ---------------------------------------------------------

Calls PsClient::one_per_shard(const char* method, const google::protobuf::MessageLite& req) {
  Calls calls;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    Call& c = add_call(calls, s, 0, method);
    wire::serialize(req, &c.request);
  }
  return calls;
}

int64_t PsClient::wait_committed(uint64_t session, int64_t step, double timeout_s) {
  WaitCommittedRequest req;
  req.set_token(opts_.token);
  req.set_session(session);
  req.set_step(step);
  using SteadyClock = std::chrono::steady_clock;
  const auto end = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                            std::chrono::duration<double>(timeout_s));
  // A shard answers a long poll after ten minutes at most: poll again while time is left.
  for (;;) {
    const double left =
        std::max(0.0, std::chrono::duration<double>(end - SteadyClock::now()).count());
    Calls calls = one_per_shard(kWait, req);
    std::vector<WaitCommittedResponse> replies(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
    try {
      run(calls, left);
    } catch (const RpcError&) {
      const Call* timed_out = nullptr;
      for (auto& c : calls) {
        if (c->status.ok()) continue;
        if (c->status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED)
          throw RpcError(describe(*c));  // e.g. the session was closed: it never commits
        if (timed_out == nullptr) timed_out = c.get();
      }
      throw WaitTimeout(absl::StrCat("session ", session, " step ", step,
                                     " not committed within ", timeout_s, " s (",
                                     describe(*timed_out), ")"));
    }
    int64_t lo = INT64_MAX;
    for (const auto& r : replies) lo = std::min(lo, r.committed_step());
    if (lo >= step) return lo;
    if (end - SteadyClock::now() < std::chrono::seconds(1))
      throw WaitTimeout(absl::StrCat("session ", session, " step ", step,
                                     " not committed within ", timeout_s,
                                     " s (committed step: ", lo, ")"));
  }
}

int64_t PsClient::committed_step(uint64_t session) {
  WaitCommittedRequest req;
  req.set_token(opts_.token);
  req.set_session(session);
  req.set_step(-1);  // always satisfied: answers at once
  Calls calls = one_per_shard(kWait, req);
  std::vector<WaitCommittedResponse> replies(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
  run(calls, opts_.timeout_s);
  int64_t lo = INT64_MAX;
  for (const auto& r : replies) lo = std::min(lo, r.committed_step());
  return lo;
}

void PsClient::close_session(uint64_t session, uint32_t rank) {
  CloseSessionRequest req;
  req.set_token(opts_.token);
  req.set_session(session);
  req.set_rank(rank);
  Calls calls = one_per_shard(kClose, req);
  run(calls, opts_.timeout_s);
}

std::vector<StatsResponse> PsClient::stats() {
  StatsRequest req;
  req.set_token(opts_.token);
  Calls calls = one_per_shard(kStats, req);
  std::vector<StatsResponse> replies(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
  run(calls, opts_.timeout_s);
  return replies;
}

std::vector<HealthResponse> PsClient::health() {
  HealthRequest req;
  req.set_token(opts_.token);
  Calls calls = one_per_shard(kHealth, req);
  std::vector<HealthResponse> replies(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
  run(calls, opts_.timeout_s);
  return replies;
}

void PsClient::shutdown() {
  ShutdownRequest req;
  req.set_token(opts_.token);
  Calls calls = one_per_shard(kShutdown, req);
  run(calls, opts_.timeout_s);
}

std::vector<SaveResponse> PsClient::save(const std::vector<std::string>& paths, int64_t step,
                                         bool check_session, uint64_t session,
                                         int64_t session_step, double timeout_s) {
  if (paths.size() != num_shards())
    throw std::invalid_argument(absl::StrCat("save needs one path per shard: ", paths.size(),
                                             " paths for ", num_shards(), " shards"));
  Calls calls;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    SaveRequest req;
    req.set_token(opts_.token);
    req.set_table(opts_.table);
    req.set_path(paths[s]);
    req.set_step(step);
    req.set_check_session(check_session);
    req.set_session(session);
    req.set_session_step(session_step);
    Call& c = add_call(calls, s, 0, kSave);
    wire::serialize(req, &c.request);
  }
  std::vector<SaveResponse> replies(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
  run(calls, timeout_s);
  return replies;
}

std::vector<LoadResponse> PsClient::load(const std::vector<std::string>& paths,
                                         const std::vector<uint64_t>& sizes,
                                         const std::vector<uint32_t>& checksums,
                                         double timeout_s) {
  LoadRequest req;
  req.set_token(opts_.token);
  req.set_table(opts_.table);
  for (const auto& p : paths) req.add_paths(p);
  for (uint64_t b : sizes) req.add_sizes(b);
  for (uint32_t c : checksums) req.add_checksums(c);
  auto stage = [&](LoadStage st, const LoadRequest& r) {
    LoadRequest copy = r;
    copy.set_stage(st);
    Calls calls = one_per_shard(kLoad, copy);
    std::vector<LoadResponse> replies(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
    run(calls, timeout_s);
    return replies;
  };
  if (num_shards() == 1) return stage(LoadStage::LOAD, req);
  // All or nothing across shards: every shard reads and checks first, then all swap in.
  std::vector<LoadResponse> prepared;
  try {
    prepared = stage(LoadStage::PREPARE, req);
  } catch (const RpcError&) {
    LoadRequest abort;
    abort.set_token(opts_.token);
    abort.set_table(opts_.table);
    try {
      stage(LoadStage::ABORT, abort);
    } catch (const RpcError&) {  // the PREPARE error is the one to report
    }
    throw;
  }
  LoadRequest commit;
  commit.set_token(opts_.token);
  commit.set_table(opts_.table);
  return stage(LoadStage::COMMIT, commit);
}

TableDump PsClient::dump() {
  DumpRequest req;
  req.set_token(opts_.token);
  req.set_table(opts_.table);
  Calls calls = one_per_shard(kDump, req);
  std::vector<DumpResponse> replies(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) calls[i]->on_reply = parse_into(&replies[i]);
  run(calls, opts_.timeout_s);
  const uint32_t dim = opts_.dim;
  struct Ref {
    int64_t key;
    uint32_t shard;
    uint32_t row;
  };
  std::vector<Ref> refs;
  for (uint32_t s = 0; s < replies.size(); ++s) {
    const DumpResponse& r = replies[s];
    const size_t n = r.keys().size() / sizeof(int64_t);
    if (r.values().size() != n * dim * sizeof(float) || r.state().size() != n * sizeof(float))
      throw RpcError(absl::StrCat("shard ", s, " (", shards_[s].address,
                                  "): malformed DumpResponse"));
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
    std::memcpy(&d.values[i * dim], r.values().data() + static_cast<size_t>(refs[i].row) * dim * 4,
                dim * sizeof(float));
    std::memcpy(&d.state[i], r.state().data() + static_cast<size_t>(refs[i].row) * 4,
                sizeof(float));
  }
  return d;
}

}  // namespace cpu_dist::ps
