#include "service.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint.h"
#include "merge.h"
#include "status_util.h"
#include "wire.h"

namespace cpu_dist::ps {

using grpc::Status;
using grpc::StatusCode;

namespace {

template <class Msg>
Status parse_request(const grpc::ByteBuffer& bb, Msg* m) {
  if (!wire::parse(bb, m))
    return invalid(absl::StrCat("malformed ", m->GetTypeName(), ": ", bb.Valid() ? bb.Length() : 0,
                                " bytes do not parse"));
  return Status::OK;
}

// Whether a request message has a table / a dim field (the preamble checks them if so).
template <class M, class = void>
struct HasTable : std::false_type {};
template <class M>
struct HasTable<M, std::void_t<decltype(std::declval<const M&>().table())>> : std::true_type {};
template <class M, class = void>
struct HasDim : std::false_type {};
template <class M>
struct HasDim<M, std::void_t<decltype(std::declval<const M&>().dim())>> : std::true_type {};

uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE))
                  : 0;
}

// Long poll for WaitCommitted: parked in CommitSessions' waiter list, finished by a commit,
// by the sweeper at its deadline, or removed when the client cancels.  gRPC owns the
// reactor's lifetime protocol: it is deleted in OnDone, after Finish completed.
class WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(CommitSessions& sessions, grpc::ByteBuffer* resp)
      : sessions_(sessions), resp_(resp) {}

  // Registers the waiter; may finish the call at once.  The reactor is referenced by
  // start() and by gRPC (until OnDone), so it outlives whichever ends last.
  void start(uint64_t session, int64_t step, CommitSessions::Clock::time_point deadline) {
    const uint64_t id = sessions_.wait(session, step, deadline,
                                       [this](int64_t c, const Status& st) { answer(c, st); });
    id_.store(id);
    unref();
  }

  void OnCancel() override {
    const uint64_t id = id_.load();
    if (id != 0 && sessions_.cancel_wait(id)) Finish(Status(StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override { unref(); }

 private:
  void unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  void answer(int64_t committed, const Status& st) {
    if (!st.ok()) {  // the session was closed or failed: the step will never commit
      Finish(st);
      return;
    }
    WaitCommittedResponse r;
    r.set_committed_step(committed);
    wire::serialize(r, resp_);
    Finish(Status::OK);
  }

  CommitSessions& sessions_;
  grpc::ByteBuffer* resp_;
  std::atomic<uint64_t> id_{0};
  std::atomic<int> refs_{2};
};

}  // namespace

PsService::PsService(const ServerOptions& opts, std::function<void()> on_shutdown)
    : opts_(opts),
      on_shutdown_(std::move(on_shutdown)),
      table_(opts.dim, opts.seed, opts.init_scale, opts.stripes, opts.max_blocks_per_stripe),
      sessions_(table_) {}

// ---- validation ---------------------------------------------------------------------

Status PsService::check_token(const std::string& token) const {
  // Constant-time in the token's content: no early exit on the first differing byte.
  const std::string& want = opts_.token;
  unsigned diff = token.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned char>(want[i]) ^
            static_cast<unsigned char>(i < token.size() ? token[i] : 0);
  if (token.empty()) return Status(StatusCode::UNAUTHENTICATED, "missing token");
  if (diff != 0) return Status(StatusCode::UNAUTHENTICATED, "wrong token");
  return Status::OK;
}

Status PsService::check_table(const std::string& table) const {
  if (table != opts_.table)
    return Status(StatusCode::NOT_FOUND, absl::StrCat("unknown table '", table,
                                                      "' (this shard serves '", opts_.table, "')"));
  return Status::OK;
}

Status PsService::check_dim(uint32_t dim) const {
  if (dim != opts_.dim)
    return invalid(absl::StrCat("dim ", dim, " does not match the table's dim ", opts_.dim));
  return Status::OK;
}

Status PsService::check_rows(const std::string& keys, const std::string* grads, size_t* n) const {
  if (keys.size() % sizeof(int64_t) != 0)
    return invalid(absl::StrCat("keys has ", keys.size(), " bytes, not a multiple of 8"));
  *n = keys.size() / sizeof(int64_t);
  if (grads != nullptr) {
    const uint64_t want = static_cast<uint64_t>(*n) * opts_.dim * sizeof(float);
    if (grads->size() != want)
      return invalid(absl::StrCat("grads has ", grads->size(), " bytes, expected ", want, " (", *n,
                                  " keys x dim ", opts_.dim, " x 4)"));
  }
  return Status::OK;
}

Status PsService::check_update(float lr, int optimizer, OptimizerKind* kind) const {
  if (!std::isfinite(lr)) return invalid(absl::StrCat("lr is not finite (", lr, ")"));
  if (optimizer == Optimizer::SGD) {
    *kind = OptimizerKind::kSgd;
  } else if (optimizer == Optimizer::ROWWISE_ADAGRAD) {
    *kind = OptimizerKind::kRowwiseAdagrad;
  } else {
    return invalid(absl::StrCat("unknown optimizer ", optimizer));
  }
  return Status::OK;
}

// ---- the shared preamble ---------------------------------------------------------------

template <class Req>
Status PsService::admit(const BB& req, Req* r) const {
  PS_RETURN_IF_ERROR(parse_request(req, r));
  PS_RETURN_IF_ERROR(check_token(r->token()));
  if constexpr (HasTable<Req>::value) PS_RETURN_IF_ERROR(check_table(r->table()));
  if constexpr (HasDim<Req>::value) PS_RETURN_IF_ERROR(check_dim(r->dim()));
  return Status::OK;
}

template <class Req>
PsService::R* PsService::handle(Ctx* ctx, const BB* req, BB* resp,
                                Status (PsService::*body)(Req&, BB*)) {
  Req r;
  Status st = admit(*req, &r);
  if (st.ok()) st = (this->*body)(r, resp);
  return finish(ctx, req, resp, std::move(st));
}

PsService::R* PsService::finish(Ctx* ctx, const BB* req, const BB* resp, Status status) {
  counters_.bytes_in.fetch_add(req->Valid() ? req->Length() : 0, std::memory_order_relaxed);
  if (status.ok()) {
    counters_.bytes_out.fetch_add(resp->Valid() ? resp->Length() : 0, std::memory_order_relaxed);
  } else {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
  }
  R* r = ctx->DefaultReactor();
  r->Finish(std::move(status));
  return r;
}

PsService::R* PsService::Pull(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_pull);
}
PsService::R* PsService::Push(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_push);
}
PsService::R* PsService::Commit(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_commit);
}
PsService::R* PsService::CloseSession(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_close);
}
PsService::R* PsService::Stats(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_stats);
}
PsService::R* PsService::Health(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_health);
}
PsService::R* PsService::Dump(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_dump);
}
PsService::R* PsService::Shutdown(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_shutdown);
}
PsService::R* PsService::Save(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_save);
}
PsService::R* PsService::Load(Ctx* ctx, const BB* req, BB* resp) {
  return handle(ctx, req, resp, &PsService::do_load);
}

// A long poll, not a unary handle(): the reply comes from a commit, the sweeper or a cancel.
PsService::R* PsService::WaitCommitted(Ctx* ctx, const BB* req, BB* resp) {
  WaitCommittedRequest r;
  Status st = admit(*req, &r);
  if (!st.ok()) return finish(ctx, req, resp, std::move(st));
  counters_.bytes_in.fetch_add(req->Length(), std::memory_order_relaxed);
  // Answer a little before the caller's deadline so that it gets a reply, not
  // DEADLINE_EXCEEDED; calls without a deadline wait at most ten minutes.
  const auto now_sys = std::chrono::system_clock::now();
  auto remaining = ctx->deadline() - now_sys;
  if (remaining > std::chrono::minutes(10)) remaining = std::chrono::minutes(10);
  remaining -= std::min<decltype(remaining)>(remaining / 10, std::chrono::milliseconds(50));
  const auto deadline = CommitSessions::Clock::now() +
                        std::chrono::duration_cast<CommitSessions::Clock::duration>(remaining);
  // gRPC's reactor protocol: the method returns a raw reactor, which deletes itself in OnDone.
  auto* reactor = new WaitReactor(sessions_, resp);
  reactor->start(r.session(), r.step(), deadline);
  return reactor;
}

// ---- methods --------------------------------------------------------------------------

Status PsService::do_pull(PullRequest& r, BB* resp) {
  size_t n = 0;
  PS_RETURN_IF_ERROR(check_rows(r.keys(), nullptr, &n));
  counters_.pull_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.pull_keys.fetch_add(n, std::memory_order_relaxed);
  if (n == 0) {
    wire::alloc_buffer(0, resp);
    return Status::OK;
  }
  // PullResponse by hand: the values field's header, then the rows gathered straight into
  // the buffer.  Refused before allocating when gRPC would refuse to send it anyway.
  constexpr int kValues = PullResponse::kValuesFieldNumber;
  const size_t payload = n * opts_.dim * sizeof(float);
  const size_t reply_bytes = wire::bytes_field_size(kValues, payload);
  if (reply_bytes > static_cast<size_t>(opts_.max_message_bytes))
    return Status(
        StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("Pull reply of ", reply_bytes, " bytes (", n, " keys x dim ", opts_.dim,
                     " x 4) exceeds max_message_bytes ", opts_.max_message_bytes));
  uint8_t* p = wire::alloc_buffer(reply_bytes, resp);
  p = wire::put_bytes_header(kValues, payload, p);
  table_.gather(reinterpret_cast<const int64_t*>(r.keys().data()), n, p);
  return Status::OK;
}

Status PsService::do_push(PushRequest& r, BB* resp) {
  size_t n = 0;
  PS_RETURN_IF_ERROR(check_rows(r.keys(), &r.grads(), &n));
  OptimizerKind kind;
  PS_RETURN_IF_ERROR(check_update(r.lr(), r.optimizer(), &kind));
  RowAccumulator acc(opts_.dim);
  acc.reserve(n);
  acc.add(r.keys().data(), r.grads().data(), n);
  try {  // all or nothing (table.h); a full stripe is the caller's problem, not a crash
    table_.apply(acc.keys().data(), acc.sums().data(), acc.size(), r.lr(), kind);
  } catch (const TableFull& e) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, "out of memory applying the push");
  }
  counters_.push_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.push_keys.fetch_add(n, std::memory_order_relaxed);
  PushResponse out;
  out.set_rows_updated(acc.size());
  wire::serialize(out, resp);
  return Status::OK;
}

Status PsService::do_commit(CommitRequest& r, BB* resp) {
  size_t n = 0;
  PS_RETURN_IF_ERROR(check_rows(r.keys(), &r.grads(), &n));
  CommitChunk c;
  PS_RETURN_IF_ERROR(check_update(r.lr(), r.optimizer(), &c.optimizer));
  c.session = r.session();
  c.step = r.step();
  c.rank = r.rank();
  c.world_size = r.world_size();
  c.chunk_index = r.chunk_index();
  c.chunk_count = r.chunk_count();
  c.lr = r.lr();
  c.keys.swap(*r.mutable_keys());
  c.grads.swap(*r.mutable_grads());
  int64_t committed = -1;
  size_t applied = 0;
  PS_RETURN_IF_ERROR(sessions_.commit(std::move(c), &committed, &applied));
  counters_.commit_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.commit_keys.fetch_add(n, std::memory_order_relaxed);
  CommitResponse out;
  out.set_committed_step(committed);
  wire::serialize(out, resp);
  return Status::OK;
}

Status PsService::do_close(CloseSessionRequest& r, BB* resp) {
  int64_t committed = -1;
  PS_RETURN_IF_ERROR(sessions_.close(r.session(), r.rank(), &committed));
  CloseSessionResponse out;
  out.set_committed_step(committed);
  wire::serialize(out, resp);
  return Status::OK;
}

StatsResponse PsService::stats() const {
  StatsResponse s;
  s.set_rows(table_.rows());
  s.set_dim(opts_.dim);
  s.set_table_bytes(table_.bytes());
  s.set_resident_bytes(resident_bytes());
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
  wire::serialize(out, resp);
  return Status::OK;
}

Status PsService::do_dump(DumpRequest&, BB* resp) {
  const TableDump d = table_.dump();
  wire::serialize_with_payloads<3>(DumpResponse(),
                                   {wire::Payload{DumpResponse::kKeysFieldNumber, d.keys.data(),
                                                  d.keys.size() * sizeof(int64_t)},
                                    wire::Payload{DumpResponse::kValuesFieldNumber, d.values.data(),
                                                  d.values.size() * sizeof(float)},
                                    wire::Payload{DumpResponse::kStateFieldNumber, d.state.data(),
                                                  d.state.size() * sizeof(float)}},
                                   resp);
  return Status::OK;
}

Status PsService::do_shutdown(ShutdownRequest&, BB* resp) {
  wire::serialize(ShutdownResponse(), resp);
  on_shutdown_();
  return Status::OK;
}

}  // namespace cpu_dist::ps
