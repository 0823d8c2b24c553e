// PsClient: construction, the call plumbing, and the data operations (pull, push, commit).
// Sessions and administration are in client_admin.cc.
#include "client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client_calls.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "merge.h"
#include "process_tuning.h"
#include "token.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

using namespace client_calls;  // NOLINT: the client's own helpers

// The options as the client keeps them: `tables` holds every table (the one table (table,
// dim) without it), and (table, dim) name the one-table calls' table, one of `tables`.
ClientOptions normalized(ClientOptions o) {
  if (o.tables.empty()) {
    if (o.dim == 0) throw std::invalid_argument("dim must be >= 1");
    o.tables.push_back(ClientTable{o.table, o.dim});
    return o;
  }
  std::vector<std::string> names;
  for (const ClientTable& t : o.tables) {
    if (t.name.empty()) throw std::invalid_argument("tables: a table name must not be empty");
    if (t.dim == 0)
      throw std::invalid_argument(absl::StrCat("tables: table '", t.name, "' has dim 0"));
    if (std::find(names.begin(), names.end(), t.name) != names.end())
      throw std::invalid_argument(absl::StrCat("tables: table '", t.name, "' named twice"));
    names.push_back(t.name);
  }
  auto it = std::find(names.begin(), names.end(), o.table);
  const ClientTable& one = o.tables[it == names.end() ? 0 : it - names.begin()];
  if (o.dim != 0 && o.dim != one.dim)
    throw std::invalid_argument(absl::StrCat("dim ", o.dim, " differs from table '", one.name,
                                             "''s dim ", one.dim, " (give dim 0 with tables)"));
  o.table = one.name;
  o.dim = one.dim;
  return o;
}

void check_options(const ClientOptions& o) {
  if (o.addresses.empty()) throw std::invalid_argument("addresses must not be empty");
  check_token_text(o.token);
  if (o.max_keys_per_rpc == 0) throw std::invalid_argument("max_keys_per_rpc must be >= 1");
  if (o.channels_per_shard == 0) throw std::invalid_argument("channels_per_shard must be >= 1");
  if (!(o.timeout_s > 0)) throw std::invalid_argument("timeout_s must be > 0");
  // One RPC of max_keys_per_rpc keys (a push/commit request, or a pull reply) of the widest
  // table must fit in max_message_bytes, with room for the small header fields (and a
  // multi-table request's list of tables).
  uint32_t widest = 0;
  uint64_t header = 1024;
  for (const ClientTable& t : o.tables) {
    widest = std::max(widest, t.dim);
    if (o.tables.size() > 1) header += t.name.size() + 32;
  }
  const uint64_t per_key = sizeof(int64_t) + static_cast<uint64_t>(widest) * sizeof(float);
  const uint64_t rpc_bytes = static_cast<uint64_t>(o.max_keys_per_rpc) * per_key + header;
  if (rpc_bytes > static_cast<uint64_t>(std::max(o.max_message_bytes, 0)))
    throw std::invalid_argument(
        absl::StrCat("max_keys_per_rpc ", o.max_keys_per_rpc, " at dim ", widest, " needs RPCs of ",
                     rpc_bytes, " bytes, more than max_message_bytes ", o.max_message_bytes));
}

// A PullResponse written by hand (service.cc): the values field's header, the rows of
// part's keys encoded as `enc`, each decoded to its position in `out`, then (when the pull
// named a session: `seen`) the committed_step field and the per-row fields it asked for.
grpc::Status decode_reply(const grpc::ByteBuffer& reply, const Part& part, uint32_t dim,
                          Encoding enc, PullReport* seen, float* out) {
  const size_t row_bytes = encoded_row_bytes(enc, dim);
  auto malformed = [&](const std::string& why) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        absl::StrCat("malformed PullResponse: expected ", part.n, " rows of dim ",
                                     dim, " encoded as ", encoding_name(enc), why));
  };
  wire::SliceReader r(reply);
  uint64_t len = 0;
  if (!r.read_bytes_header_or_empty(PullResponse::kValuesFieldNumber, &len) ||
      len != part.n * row_bytes || r.remaining() < len)
    return malformed("");
  size_t bad = 0;
  CodecError err;
  if (!client_calls::read_rows(r, enc, dim, part.idx, part.n, out, &bad, &err))
    return malformed(absl::StrCat(": row ", bad, ": ", describe(enc, err)));
  if (seen != nullptr) {
    int64_t committed = 0;
    if (!r.read_int64_field(PullResponse::kCommittedStepFieldNumber, &committed))
      return malformed(" and a committed_step (the pull named a session)");
    seen->note(committed);
    if (seen->wants_steps()) {
      if (!r.read_bytes_header_or_empty(PullResponse::kRowStepsFieldNumber, &len) || len != part.n)
        return malformed(absl::StrCat(" and ", part.n, " row_steps"));
      std::vector<uint8_t> beyond(part.n);
      if (!r.read(beyond.data(), part.n)) return malformed(" and row_steps (cut short)");
      for (size_t j = 0; j < part.n; ++j)  // 255: no bound the reader may rely on
        seen->steps()[part.idx[j]] = beyond[j] == 255 ? kUnknownStep : committed + beyond[j];
    }
    if (seen->wants_states()) {  // state_width floats a row (Adagrad: dim)
      const size_t w = seen->state_width();
      if (!r.read_bytes_header_or_empty(PullResponse::kRowStatesFieldNumber, &len) ||
          len != part.n * w * sizeof(float))
        return malformed(absl::StrCat(" and ", part.n * w, " row_states floats"));
      for (size_t j = 0; j < part.n; ++j)
        if (!r.read(seen->states() + part.idx[j] * w, w * sizeof(float)))
          return malformed(" and row_states (cut short)");
    }
  }
  if (r.remaining() != 0) return malformed(absl::StrCat(": ", r.remaining(), " bytes too many"));
  return grpc::Status::OK;
}

}  // namespace

// ---- construction and teardown ------------------------------------------------------------

PsClient::PsClient(ClientOptions opts) : opts_(normalized(std::move(opts))) {
  check_options(opts_);
  tune_process_once();
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
      // Reconnect soon after a lost connection (gRPC's default waits a second), so that a
      // retry after its back-off (kFirstBackoff...) finds the connection being made again.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
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

// ---- call plumbing ------------------------------------------------------------------------

RpcError PsClient::describe(const Call& c) const {
  const std::string& address = shards_[c.shard].address;
  const char* code = code_name(c.status.error_code());
  return RpcError(
      absl::StrCat("shard ", c.shard, " (", address, "): ", code, ": ", c.status.error_message()),
      c.shard, address, code);
}

SplitLimits PsClient::limits() const {
  return SplitLimits{num_shards(), opts_.max_keys_per_rpc, opts_.channels_per_shard};
}

Call& PsClient::add_call(Calls& calls, uint32_t shard, uint32_t channel, const char* method) {
  auto c = std::make_unique<Call>();
  c->shard = shard;
  c->channel = channel % opts_.channels_per_shard;
  c->method = method;
  calls.push_back(std::move(c));
  return *calls.back();
}

Call& PsClient::add_part_call(Calls& calls, const Part& part, const char* method, TrafficKind kind,
                              Encoding enc) {
  Call& c = add_call(calls, part.shard, part.channel, method);
  // Pull: keys out, one encoded row per key back; push and commit: keys and one encoded row
  // per key out.
  c.traffic = kind;
  c.traffic_keys = part.n;
  c.traffic_bytes = part.n * (sizeof(int64_t) + encoded_row_bytes(enc, opts_.dim));
  return c;
}

void PsClient::start_call(Call& c, grpc::CompletionQueue* cq,
                          std::chrono::system_clock::time_point deadline) {
  c.deadline = deadline;
  c.reader.reset();  // lives in the previous attempt's call arena: before its context goes
  c.ctx = std::make_unique<grpc::ClientContext>();
  c.ctx->set_deadline(deadline);
  c.ctx->AddMetadata(kTokenMetadataKey, opts_.token);
  c.response.Clear();
  c.reader =
      shards_[c.shard].stubs[c.channel]->PrepareUnaryCall(c.ctx.get(), c.method, c.request, cq);
  c.reader->StartCall();
  c.reader->Finish(&c.response, &c.status, &c);
}

bool PsClient::advance(Call& c, grpc::CompletionQueue* cq) {
  if (c.backing_off) {  // the alarm: send it again
    c.backing_off = false;
    start_call(c, cq, c.deadline);
    return true;
  }
  if (!c.idempotent || c.retries >= kMaxRetries ||
      c.status.error_code() != grpc::StatusCode::UNAVAILABLE)
    return false;
  const auto wake = std::chrono::system_clock::now() + kFirstBackoff * (1u << c.retries);
  if (wake >= c.deadline) return false;  // within the call's own deadline, or not at all
  ++c.retries;
  traffic_.add_retry();
  c.backing_off = true;
  c.alarm = std::make_unique<grpc::Alarm>();
  c.alarm->Set(cq, wake, &c);
  return true;
}

void PsClient::settle(Call& c) {
  if (c.status.ok() && c.on_reply) c.status = c.on_reply(c);
  if (c.status.ok()) traffic_.add(c.traffic, c.traffic_keys, c.traffic_bytes);
}

void PsClient::run_calls(Calls& calls, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (closed_) throw std::runtime_error("client is closed");
  }
  grpc::CompletionQueue cq;
  const auto deadline = deadline_in(timeout_s);
  for (auto& c : calls) start_call(*c, &cq, deadline);
  for (size_t left = calls.size(); left > 0;) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    Call& c = *static_cast<Call*>(tag);
    if (advance(c, &cq)) continue;
    settle(c);  // decode while the others fly
    --left;
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

void PsClient::throw_first_failure(const Calls& calls) const {
  for (const auto& c : calls)
    if (!c->status.ok()) throw describe(*c);
}

void PsClient::run(Calls& calls, double timeout_s) {
  run_calls(calls, timeout_s);
  throw_first_failure(calls);
}

std::shared_ptr<AsyncOp> PsClient::run_async(Calls calls, std::function<void()> on_success,
                                             std::vector<RowBuffer> outputs,
                                             std::vector<std::shared_ptr<const PullReport>> seen,
                                             std::optional<double> timeout_s) {
  auto op = std::make_shared<AsyncOp>(
      std::move(calls), [this](const Call& c) { return describe(c); }, std::move(on_success),
      std::move(outputs), std::move(seen));
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (closed_) throw std::runtime_error("client is closed");
    if (op->calls().empty()) return op;
    pending_.emplace(op.get(), op);
  }
  const auto deadline = deadline_in(timeout_s.value_or(opts_.timeout_s));
  for (auto& c : op->calls()) start_call(*c, &async_cq_, deadline);
  return op;
}

void PsClient::async_loop() {
  void* tag = nullptr;
  bool ok = false;
  while (async_cq_.Next(&tag, &ok)) {
    Call* c = static_cast<Call*>(tag);
    if (advance(*c, &async_cq_)) continue;
    settle(*c);
    AsyncOp* op = c->op;
    if (!op->finish_call()) continue;
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

// ---- pull -----------------------------------------------------------------------------------

PsClient::PullRoute PsClient::route_pull(const PullOptions& po) const {
  if (!po.after_step) return {kPull, SplitRule::kSpreadOverChannels, opts_.timeout_s};
  if (!po.session) throw std::invalid_argument("a pull's after_step needs a session");
  if (*po.after_step < 0)
    throw std::invalid_argument("a pull's after_step must be >= 0, got " +
                                std::to_string(*po.after_step));
  if (!(po.wait_timeout_s > 0))
    throw std::invalid_argument("a pull's after_step needs a wait_timeout > 0");
  return {kPullCommitted, SplitRule::kChunkEveryShard, po.wait_timeout_s};
}

PsClient::PullPlan PsClient::plan_pull(const int64_t* keys, size_t n, float* out,
                                       const PullOptions& po) {
  check_count(n);
  const uint32_t dim = opts_.dim;
  const Encoding enc = po.compression.value_or(opts_.compression);
  // Shared with the calls' decoders (and finish), which may outlive this frame (pull_async).
  auto firsts = std::make_shared<const FirstOccurrences>(keys, n);
  const PullRoute route = route_pull(po);
  PullPlan plan;
  plan.timeout_s = route.timeout_s;
  auto split = std::make_shared<const ShardSplit>(keys, n, firsts->select(), limits(), route.rule,
                                                  next_channel_base());
  PullRequest head;
  head.set_table(opts_.table);
  head.set_dim(dim);
  head.set_compression(to_proto(enc));
  if (po.session) head.set_session(*po.session);
  if (po.after_step) head.set_after_step(*po.after_step);
  PartPayload payload;
  payload.keys = keys;
  payload.keys_field = PullRequest::kKeysFieldNumber;
  if ((po.row_steps || po.row_states) && !po.session)
    throw std::invalid_argument("a pull's row_steps and row_states need a session");
  // An Adagrad table's rows carry dim state floats (the width asked of the shards once).
  const uint32_t width = po.row_states ? state_width(*table_index(opts_.table)) : 1;
  if (po.session) plan.seen = std::make_shared<PullReport>(n, po.row_steps, po.row_states, width);
  head.set_row_steps(po.row_steps);
  head.set_row_states(po.row_states);
  for (const Part& p : split->parts()) {
    Call& c = add_part_call(plan.calls, p, route.method, TrafficKind::kPull, enc);
    c.idempotent = true;
    // the per-row fields cross the wire too: one byte per row_step, a float per row_state
    c.traffic_bytes += p.n * ((po.row_steps ? 1 : 0) + (po.row_states ? width * sizeof(float) : 0));
    (void)ShardSplit::serialize(p, head, payload, &c.request);  // keys only: cannot fail
    c.on_reply = [split, p, dim, enc, seen = plan.seen, out](Call& call) {
      return decode_reply(call.response, p, dim, enc, seen.get(), out);
    };
  }
  if (firsts->has_duplicates())
    plan.finish = [firsts, dim, out, seen = plan.seen] {
      firsts->copy_duplicates(out, dim);
      if (seen && seen->wants_steps()) firsts->copy_duplicates(seen->steps(), 1);
      if (seen && seen->wants_states())
        firsts->copy_duplicates(seen->states(), seen->state_width());
    };
  return plan;
}

void PsClient::pull(const int64_t* keys, size_t n, float* out, const PullOptions& po) {
  PullPlan plan = plan_pull(keys, n, out, po);
  // On the caller's thread, not the shared completion thread: concurrent callers decode
  // their (large) replies in parallel.
  if (!plan.calls.empty()) run(plan.calls, plan.timeout_s);
  if (plan.finish) plan.finish();
  if (plan.seen) {
    std::lock_guard<std::mutex> lock(last_pull_mu_);
    last_pull_committed_ = plan.seen->value();
  }
}

std::optional<uint32_t> PsClient::table_index(const std::string& name) const {
  for (size_t i = 0; i < opts_.tables.size(); ++i)
    if (opts_.tables[i].name == name) return static_cast<uint32_t>(i);
  return std::nullopt;
}

std::optional<int64_t> PsClient::last_pull_committed() const {
  std::lock_guard<std::mutex> lock(last_pull_mu_);
  return last_pull_committed_;
}

std::shared_ptr<AsyncOp> PsClient::pull_async(const int64_t* keys, size_t n,
                                              const PullOptions& po) {
  RowBuffer rows = alloc_rows(n * opts_.dim);
  PullPlan plan = plan_pull(keys, n, rows.get(), po);  // the op owns what `out` points to
  std::vector<RowBuffer> outputs;
  outputs.push_back(std::move(rows));
  return run_async(std::move(plan.calls), std::move(plan.finish), std::move(outputs),
                   {std::move(plan.seen)}, plan.timeout_s);
}

// ---- push / commit --------------------------------------------------------------------------

std::shared_ptr<AsyncOp> PsClient::push_async(const Gradients& g) {
  check_count(g.n);
  // Merge duplicates here (in order) so that splitting never applies a key twice.
  RowAccumulator acc(opts_.dim);
  acc.reserve(g.n);
  acc.add(g.keys, g.grads, g.n);
  const ShardSplit split(acc.keys().data(), acc.size(), nullptr, limits(),
                         SplitRule::kSpreadOverChannels, next_channel_base());
  PushRequest head;
  head.set_table(opts_.table);
  head.set_dim(opts_.dim);
  head.set_lr(g.lr);
  head.set_optimizer(to_proto(g.optimizer));
  const Encoding enc = opts_.compression;
  head.set_compression(to_proto(enc));
  const PartPayload payload{acc.keys().data(), PushRequest::kKeysFieldNumber,
                            acc.sums().data(), PushRequest::kGradsFieldNumber,
                            opts_.dim,         enc};
  Calls calls;
  for (const Part& p : split.parts()) {
    Call& c = add_part_call(calls, p, kPush, TrafficKind::kPush, enc);
    if (auto failed = ShardSplit::serialize(p, head, payload, &c.request))
      refuse_gradient(*failed, acc.keys()[failed->index], enc, "push");
  }
  return run_async(std::move(calls));
}

std::shared_ptr<AsyncOp> PsClient::commit_async(const CommitPoint& at, const Gradients& g) {
  check_count(g.n);
  // No merging: the shard sums per key in rank then chunk order, which is input order.
  const ShardSplit split(g.keys, g.n, nullptr, limits(), SplitRule::kChunkEveryShard,
                         next_channel_base());
  const Encoding enc = opts_.compression;
  CommitRequest head;
  set_commit_head(&head, at, enc);
  head.set_table(opts_.table);
  head.set_dim(opts_.dim);
  head.set_lr(g.lr);
  head.set_optimizer(to_proto(g.optimizer));
  const PartPayload payload{g.keys,    CommitRequest::kKeysFieldNumber,
                            g.grads,   CommitRequest::kGradsFieldNumber,
                            opts_.dim, enc};
  Calls calls;
  for (const Part& p : split.parts()) {
    set_chunk(&head, p.index, p.count);
    Call& c = add_part_call(calls, p, kCommit, TrafficKind::kPush, enc);
    c.idempotent = true;  // the shard acknowledges an identical chunk again
    if (auto failed = ShardSplit::serialize(p, head, payload, &c.request))
      refuse_gradient(*failed, g.keys[failed->index], enc, commit_where(at));
  }
  return run_async(std::move(calls));
}

// The blocking forms: the asynchronous operation, then a wait (every call has a deadline).
void PsClient::push(const Gradients& g) {
  std::shared_ptr<AsyncOp> op = push_async(g);
  op->wait(-1);
  op->raise_if_failed();
}

void PsClient::commit(const CommitPoint& at, const Gradients& g) {
  std::shared_ptr<AsyncOp> op = commit_async(at, g);
  op->wait(-1);
  op->raise_if_failed();
}

}  // namespace cpu_dist::ps
