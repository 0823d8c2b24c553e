// PsService: the shared preamble and the data methods (Pull, Push, Commit, WaitCommitted,
// CloseSession).  Validation is in service_checks.cc, administration in service_admin.cc,
// checkpoints in service_checkpoint.cc.
#include "service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "merge.h"
#include "method_paths.h"
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

}  // namespace

std::optional<Method> method_of(const std::string& path) {
  static constexpr std::pair<const char*, Method> kMethods[] = {
      {paths::kPull, Method::kPull},
      {paths::kPush, Method::kPush},
      {paths::kCommit, Method::kCommit},
      {paths::kWaitCommitted, Method::kWaitCommitted},
      {paths::kPullCommitted, Method::kPullCommitted},
      {paths::kCloseSession, Method::kCloseSession},
      {paths::kAbortSessions, Method::kAbortSessions},
      {paths::kStats, Method::kStats},
      {paths::kHealth, Method::kHealth},
      {paths::kDump, Method::kDump},
      {paths::kShutdown, Method::kShutdown},
      {paths::kSave, Method::kSave},
      {paths::kLoad, Method::kLoad},
      {paths::kCreateTables, Method::kCreateTables},
  };
  for (const auto& [p, m] : kMethods)
    if (path == p) return m;
  return std::nullopt;
}

namespace {

TablesOptions tables_options(const ServerOptions& o) {
  TablesOptions t;
  t.stripes = o.stripes;
  t.max_blocks_per_stripe = o.max_blocks_per_stripe;
  t.tiers.memory_rows = o.memory_rows;
  // One budget object for every table of the shard (memory_budget.h).
  if (o.memory_bytes > 0) t.tiers.budget = std::make_shared<MemoryBudget>(o.memory_bytes);
  t.tiers.ssd_dir = o.ssd_dir;
  t.tiers.ssd_name = absl::StrCat("shard-", o.shard_index);
  return t;
}

// The tables a shard starts with: ServerOptions::tables, or the one its flags declare.
std::vector<ShardTableSpec> initial_tables(const ServerOptions& o) {
  if (!o.tables.empty() || o.dim == 0) return o.tables;
  ShardTableSpec s;
  s.name = o.table;
  s.dim = o.dim;
  s.seed = o.seed;
  s.init_scale = o.init_scale;
  s.admit_after = o.admit_after;
  s.expire_after = o.expire_after;
  s.flag_declared = true;
  return {s};
}

}  // namespace

PsService::PsService(const ServerOptions& opts, std::function<void()> on_shutdown)
    : opts_(opts),
      on_shutdown_(std::move(on_shutdown)),
      hooks_(opts.test_hooks ? std::make_unique<TestHooks>() : nullptr),
      tables_(tables_options(opts), hooks_.get()),
      sessions_(tables_,
                SessionLimits{opts.max_sessions, opts.max_held_bytes, opts.max_pending_bytes}) {
  for (const ShardTableSpec& spec : initial_tables(opts)) {
    bool created = false;
    const Status st = tables_.create(spec, &created);
    if (!st.ok()) throw std::invalid_argument(st.error_message());
    if (!created)
      throw std::invalid_argument(absl::StrCat("table '", spec.name, "' is listed twice"));
  }
}

// ---- the shared preamble ---------------------------------------------------------------

template <class Req>
Status PsService::admit(const BB& req, Req* r) const {
  return parse_request(req, r);
}

template <class Req>
Status PsService::call(const BB& req, BB* resp, Status (PsService::*body)(Req&, BB*)) {
  Req r;
  PS_RETURN_IF_ERROR(admit(req, &r));
  return (this->*body)(r, resp);
}

template <class F>
Status PsService::guarded(F&& f) {
  try {
    return f();
  } catch (const TierError& e) {
    return Status(e.no_space() ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::INTERNAL, e.what());
  } catch (const TableFull& e) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::INTERNAL, e.what());
  }
}

Status PsService::run(Method m, const BB& req, BB* resp, bool* deferred) {
  return guarded([&] {
    try {
      return dispatch(m, req, resp, deferred == nullptr);
    } catch (const WouldBlock&) {
      *deferred = true;  // thrown only when not waiting, that is with `deferred`
      return Status::OK;
    }
  });
}

Status PsService::dispatch(Method m, const BB& req, BB* resp, bool wait) {
  switch (m) {
    case Method::kPull: return call(req, resp, &PsService::do_pull);
    case Method::kPush: {
      PushRequest r;
      PS_RETURN_IF_ERROR(admit(req, &r));
      return do_push(r, resp, wait);
    }
    case Method::kCommit: {
      CommitRequest r;
      PS_RETURN_IF_ERROR(admit(req, &r));
      return do_commit(r, resp, wait);
    }
    case Method::kCloseSession: return call(req, resp, &PsService::do_close);
    case Method::kAbortSessions: return call(req, resp, &PsService::do_abort);
    case Method::kStats: return call(req, resp, &PsService::do_stats);
    case Method::kHealth: return call(req, resp, &PsService::do_health);
    case Method::kDump: return call(req, resp, &PsService::do_dump);
    case Method::kShutdown: return call(req, resp, &PsService::do_shutdown);
    case Method::kSave: return call(req, resp, &PsService::do_save);
    case Method::kLoad: return call(req, resp, &PsService::do_load);
    case Method::kCreateTables: return call(req, resp, &PsService::do_create_tables);
    case Method::kWaitCommitted:
    case Method::kPullCommitted: break;
  }
  return Status(StatusCode::INTERNAL, "WaitCommitted and PullCommitted are long polls, not unary");
}

void PsService::count(const BB* req, const BB* resp, const Status& status) {
  counters_.bytes_in.fetch_add(req->Valid() ? req->Length() : 0, std::memory_order_relaxed);
  if (status.ok()) {
    counters_.bytes_out.fetch_add(resp->Valid() ? resp->Length() : 0, std::memory_order_relaxed);
  } else {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
  }
}

Status PsService::start_wait(const BB& req, Clock::time_point deadline,
                             CommitSessions::WaitCallback done, uint64_t* waiter) {
  WaitCommittedRequest r;
  PS_RETURN_IF_ERROR(admit(req, &r));
  *waiter = sessions_.wait(r.session(), r.step(), deadline, std::move(done));
  return Status::OK;
}

// ---- methods --------------------------------------------------------------------------

Status PsService::start_pull_committed(const BB& req, Clock::time_point deadline, BB* resp,
                                       std::function<void(const Status&)> done, uint64_t* waiter) {
  auto r = std::make_shared<PullRequest>();
  PS_RETURN_IF_ERROR(admit(req, r.get()));
  if (!r->has_session() || !r->has_after_step() || r->after_step() < 0)
    return Status(StatusCode::INVALID_ARGUMENT,
                  "PullCommitted: needs a session and an after_step >= 0 (the session step "
                  "whose commit the rows wait for)");
  size_t n = 0;
  std::vector<Part> parts;
  Encoding enc;
  PS_RETURN_IF_ERROR(check_pull(*r, &n, &parts, &enc));  // refused now, not at the commit
  const uint64_t session = r->session();
  const int64_t step = r->after_step();
  *waiter = sessions_.wait(
      session, step, deadline,
      [this, r, resp, session, step, done = std::move(done)](int64_t committed, const Status& st) {
        if (!st.ok()) return done(st);  // the session ended or failed: no such commit
        if (committed < step)
          return done(Status(StatusCode::DEADLINE_EXCEEDED,
                             absl::StrCat("PullCommitted: step ", step, " of session ", session,
                                          " not committed on this shard by the call's "
                                          "deadline (committed: ",
                                          committed, ")")));
        done(guarded([&] { return do_pull(*r, resp); }));
      });
  return Status::OK;
}

Status PsService::check_pull(const PullRequest& r, size_t* n, std::vector<Part>* parts,
                             Encoding* enc) const {
  PS_RETURN_IF_ERROR(check_keys(r.keys(), n));
  PS_RETURN_IF_ERROR(resolve_parts(r.table(), r.dim(), r.parts(), *n, false, 0.0f, 0, parts));
  PS_RETURN_IF_ERROR(check_encoding(r.compression(), enc));
  if (r.row_steps() && !r.has_session())
    return Status(StatusCode::INVALID_ARGUMENT,
                  "Pull: row_steps needs a session (the steps are that session's)");
  return Status::OK;
}

Status PsService::do_pull(PullRequest& r, BB* resp) {
  size_t n = 0;
  std::vector<Part> parts;
  Encoding enc;
  PS_RETURN_IF_ERROR(check_pull(r, &n, &parts, &enc));
  counters_.pull_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.pull_keys.fetch_add(n, std::memory_order_relaxed);
  // Read before the rows are gathered: they hold at least every step up to it.
  PullExtras extras{r.session(), std::nullopt, r.row_steps(), r.row_states()};
  if (r.has_session()) extras.session = sessions_.position(r.session());
  return write_rows(reinterpret_cast<const int64_t*>(r.keys().data()), parts, enc, extras, resp);
}

namespace {

constexpr uint8_t kNoBound = 255;  // PullResponse.row_steps: the shard gives no bound

// A row's PullResponse.row_steps byte: how many of the session's steps beyond `committed` (read
// before the gather) the row holds, given what bounded the session's writes after it.  A step
// of the session is in the row only if it had begun to apply (w.begun) and the row's job step
// is not one another session may have left (w.others_upto); in between the shard cannot tell
// whose the row's step is and says so (kNoBound) rather than guess.
uint8_t steps_beyond(int64_t last_update, int64_t committed, const CommitSessions::Writes& w) {
  if (!w.known || last_update == kNoStep || w.begun <= committed) return 0;
  const int64_t step = last_update - w.base;  // both within 0..2^62 (commit.h kMaxStep)
  // At or before `committed`: whoever wrote it, no later step of the session did (it would
  // have raised the row's step).  Past `begun`: no step of the session.
  if (step <= committed || step > w.begun) return 0;
  if (last_update <= w.others_upto) return kNoBound;
  return static_cast<uint8_t>(std::min<int64_t>(step - committed, kNoBound));
}

}  // namespace

Status PsService::write_rows(const int64_t* keys, const std::vector<Part>& parts, Encoding enc,
                             const PullExtras& extras, BB* resp) const {
  // The session's committed step, when the request named one (a plain pair, not an optional:
  // GCC sees an optional's payload as maybe unset across the gather loop).
  const bool has_committed = extras.session.has_value();
  const int64_t committed_step = has_committed ? extras.session->committed : -1;
  // PullResponse by hand: the values field's header, the rows gathered straight into the
  // buffer (encoded through a cache-sized block when compressed), then committed_step,
  // row_steps and row_states.  Refused before allocating when gRPC would refuse to send it.
  constexpr int kValues = PullResponse::kValuesFieldNumber;
  constexpr int kCommitted = PullResponse::kCommittedStepFieldNumber;
  size_t n = 0, payload = 0, state_floats = 0;
  for (const Part& part : parts) {
    n += part.count;
    payload += part.count * encoded_row_bytes(enc, part.table->dim());
    state_floats += part.count * part.table->state_floats();
  }
  const size_t steps_bytes = extras.steps ? n : 0;
  const size_t states_bytes = extras.states ? state_floats * sizeof(float) : 0;
  const auto optional_bytes = [](int field, size_t len) {
    return len > 0 ? wire::bytes_field_size(field, len) : 0;
  };
  const size_t reply_bytes =
      optional_bytes(kValues, payload) +
      (has_committed ? wire::int64_field_size(kCommitted, committed_step) : 0) +
      optional_bytes(PullResponse::kRowStepsFieldNumber, steps_bytes) +
      optional_bytes(PullResponse::kRowStatesFieldNumber, states_bytes);
  if (reply_bytes > static_cast<size_t>(opts_.max_message_bytes)) {
    const std::string rows =
        parts.size() == 1 ? absl::StrCat(n, " keys x ", row_bytes_text(enc, parts[0].table->dim()))
                          : absl::StrCat(n, " keys of ", parts.size(), " tables");
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("Pull reply of ", reply_bytes, " bytes (", rows,
                               ") exceeds max_message_bytes ", opts_.max_message_bytes));
  }
  std::vector<int64_t> steps(steps_bytes > 0 ? n : 0);
  std::vector<float> states(states_bytes > 0 ? state_floats : 0);
  uint8_t* p = wire::alloc_buffer(reply_bytes, resp);
  if (payload > 0) p = wire::put_bytes_header(kValues, payload, p);
  size_t state_at = 0;  // floats of `states` the parts before this one filled
  for (const Part& part : parts) {
    const ShardTable& table = *part.table;
    const uint32_t dim = table.dim(), sw = table.state_floats();
    const int64_t* k = keys + part.begin;
    float* state_out = states.empty() ? nullptr : states.data() + state_at;
    int64_t* step_out = steps.empty() ? nullptr : steps.data() + part.begin;
    const size_t row_bytes = encoded_row_bytes(enc, dim);
    if (enc == Encoding::kNone) {
      table.gather(k, part.count, p, state_out, step_out);
    } else {
      constexpr size_t kBlockFloats = 16384;  // 64 KiB of float32 rows at a time
      const size_t block = std::max<size_t>(1, kBlockFloats / dim);
      std::vector<float> rows(std::min(part.count, block) * dim);
      for (size_t b = 0; b < part.count; b += block) {
        const size_t m = std::min(block, part.count - b);
        table.gather(k + b, m, rows.data(), state_out ? state_out + b * sw : nullptr,
                     step_out ? step_out + b : nullptr);
        size_t bad = 0;
        CodecError err;
        if (!encode_rows(enc, rows.data(), m, dim, p + b * row_bytes, &bad, &err))
          return Status(
              StatusCode::OUT_OF_RANGE,
              absl::StrCat("the row of key ", k[b + bad],
                           parts.size() > 1 ? absl::StrCat(" of table '", table.spec().name, "'")
                                            : std::string(),
                           " cannot be pulled as ", encoding_name(enc), ": ", describe(enc, err),
                           "; pull it with compression none"));
      }
    }
    p += part.count * row_bytes;
    state_at += part.count * sw;
  }
  if (has_committed) p = wire::put_int64_field(kCommitted, committed_step, p);
  if (steps_bytes > 0) {
    const CommitSessions::Writes w = sessions_.writes(extras.session_id);  // after the gather
    p = wire::put_bytes_header(PullResponse::kRowStepsFieldNumber, steps_bytes, p);
    for (size_t i = 0; i < n; ++i) *p++ = steps_beyond(steps[i], committed_step, w);
  }
  if (states_bytes > 0) {
    p = wire::put_bytes_header(PullResponse::kRowStatesFieldNumber, states_bytes, p);
    std::memcpy(p, states.data(), states_bytes);
  }
  return Status::OK;
}

Status PsService::do_push(PushRequest& r, BB* resp, bool wait) {
  size_t n = 0;
  Encoding enc;
  PS_RETURN_IF_ERROR(check_encoding(r.compression(), &enc));
  PS_RETURN_IF_ERROR(check_keys(r.keys(), &n));
  std::vector<Part> parts;
  PS_RETURN_IF_ERROR(
      resolve_parts(r.table(), r.dim(), r.parts(), n, true, r.lr(), r.optimizer(), &parts));
  PS_RETURN_IF_ERROR(check_grads(parts, r.grads(), enc));
  DecodeBudget budget(decoding_bytes_);  // until the push is applied
  PS_RETURN_IF_ERROR(decode_grads(enc, parts, r.keys(), r.mutable_grads(), "push", &budget));
  PS_RETURN_IF_ERROR(check_finite(parts, r.keys(), r.grads(), "push"));
  // Each table's rows summed (keys unique), then every table at once: all or nothing across
  // them, and a lock met at any table (WouldBlock, without wait) before any table changed, so
  // the request's retry on a thread that may wait applies it once (push_tables, tables.h).
  std::vector<RowAccumulator> sums;
  sums.reserve(parts.size());
  std::vector<StepUpdate> updates;
  updates.reserve(parts.size());
  size_t updated = 0;
  const char* g = r.grads().data();
  for (const Part& p : parts) {
    const uint32_t dim = p.table->dim();
    RowAccumulator& acc = sums.emplace_back(dim);
    acc.reserve(p.count);
    acc.add(r.keys().data() + p.begin * sizeof(int64_t), g, p.count);
    g += p.count * dim * sizeof(float);
    updates.push_back(
        StepUpdate{p.table, acc.keys().data(), acc.sums().data(), acc.size(), p.lr, p.kind});
    updated += acc.size();
  }
  try {  // all or nothing (table.h); a full stripe is the caller's problem, not a crash
    if (updates.size() == 1) {
      const StepUpdate& u = updates[0];
      u.table->apply(u.keys, u.grads, u.n, u.lr, u.optimizer, wait);
    } else {
      push_tables(updates, wait);
    }
  } catch (const TableFull& e) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, e.what());
  } catch (const AppliedThenFailed& e) {  // as a commit's: a full SSD is no internal error
    return Status(e.no_space() ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::INTERNAL, e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::RESOURCE_EXHAUSTED, "out of memory applying the push");
  }
  counters_.push_calls.fetch_add(1, std::memory_order_relaxed);
  counters_.push_keys.fetch_add(n, std::memory_order_relaxed);
  PushResponse out;
  out.set_rows_updated(updated);
  wire::serialize(out, resp);
  return Status::OK;
}

Status PsService::do_commit(CommitRequest& r, BB* resp, bool wait) {
  size_t n = 0;
  Encoding enc;
  PS_RETURN_IF_ERROR(check_encoding(r.compression(), &enc));
  PS_RETURN_IF_ERROR(check_keys(r.keys(), &n));
  std::vector<Part> parts;
  PS_RETURN_IF_ERROR(
      resolve_parts(r.table(), r.dim(), r.parts(), n, true, r.lr(), r.optimizer(), &parts));
  PS_RETURN_IF_ERROR(check_grads(parts, r.grads(), enc));
  const std::string where =
      absl::StrCat("session ", r.session(), " step ", r.step(), " rank ", r.rank());
  // Decoded on arrival: the session holds, compares (retries) and sums float32 rows.
  DecodeBudget budget(decoding_bytes_);  // until the session took (or dropped) the chunk
  PS_RETURN_IF_ERROR(decode_grads(enc, parts, r.keys(), r.mutable_grads(), where, &budget));
  PS_RETURN_IF_ERROR(check_finite(parts, r.keys(), r.grads(), where));
  CommitChunk c;
  c.session = r.session();
  c.step = r.step();
  c.rank = r.rank();
  c.world_size = r.world_size();
  c.chunk_index = r.chunk_index();
  c.chunk_count = r.chunk_count();
  c.max_ahead = r.max_ahead();
  c.base_step = r.base_step();
  c.parts.reserve(parts.size());
  for (const Part& p : parts) c.parts.push_back(ChunkPart{p.table, p.count, p.lr, p.kind});
  c.keys.swap(*r.mutable_keys());
  c.grads.swap(*r.mutable_grads());
  int64_t committed = -1;
  size_t applied = 0;
  PS_RETURN_IF_ERROR(sessions_.commit(std::move(c), &committed, &applied, wait));
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

}  // namespace cpu_dist::ps
