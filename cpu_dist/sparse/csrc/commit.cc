#include "commit.h"

#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "merge.h"
#include "status_util.h"

namespace cpu_dist::ps {

namespace {
constexpr size_t kMaxClosedRemembered = 4096;

grpc::Status closed_status(uint64_t session, int64_t committed) {
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("session ", session, " is closed (committed step ", committed, ")"));
}

// A chunk for a closed session: a retry of a committed step is acknowledged, nothing else.
grpc::Status closed_reply(uint64_t session, int64_t step, int64_t final_step, int64_t* committed) {
  if (step > final_step) return closed_status(session, final_step);
  *committed = final_step;
  return grpc::Status::OK;
}

bool same_chunk(const CommitChunk& a, const CommitChunk& b) {
  return a.chunk_count == b.chunk_count && std::memcmp(&a.lr, &b.lr, sizeof(float)) == 0 &&
         a.optimizer == b.optimizer && a.keys == b.keys && a.grads == b.grads;
}
}  // namespace

grpc::Status CommitSessions::find_or_create(uint64_t session, uint32_t world_size,
                                            std::shared_ptr<Session>* out, int64_t* closed_at) {
  std::lock_guard<std::mutex> lock(mu_);
  out->reset();
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    *out = it->second;
    return grpc::Status::OK;
  }
  // A late chunk must not bring a dropped session back (at committed -1).
  auto ct = closed_.find(session);
  if (ct != closed_.end()) {
    *closed_at = ct->second;
    return grpc::Status::OK;
  }
  if (sessions_.size() >= kMaxLiveSessions)
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("too many live sessions (", sessions_.size(),
                                     "); close finished sessions first"));
  auto s = std::make_shared<Session>();
  s->world_size = world_size;
  s->closed.assign(world_size, false);
  sessions_.emplace(session, s);
  *out = std::move(s);
  return grpc::Status::OK;
}

grpc::Status CommitSessions::validate(const CommitChunk& c) {
  using grpc::Status;
  using grpc::StatusCode;
  if (c.world_size == 0)
    return Status(StatusCode::INVALID_ARGUMENT, "world_size must be >= 1, got 0");
  if (c.world_size > kMaxWorldSize)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("world_size ", c.world_size, " exceeds ", kMaxWorldSize));
  if (c.rank >= c.world_size)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("rank ", c.rank, " out of range for world_size ", c.world_size));
  if (c.chunk_count == 0)
    return Status(StatusCode::INVALID_ARGUMENT, "chunk_count must be >= 1, got 0");
  if (c.chunk_count > kMaxChunkCount)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("chunk_count ", c.chunk_count, " exceeds ", kMaxChunkCount));
  if (c.chunk_index >= c.chunk_count)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("chunk_index ", c.chunk_index, " out of range for chunk_count ",
                               c.chunk_count));
  if (c.step < 0)
    return Status(StatusCode::INVALID_ARGUMENT, absl::StrCat("step must be >= 0, got ", c.step));
  return Status::OK;
}

grpc::Status CommitSessions::commit(CommitChunk&& c, int64_t* committed, size_t* rows_applied) {
  *rows_applied = 0;
  PS_RETURN_IF_ERROR(validate(c));
  const uint64_t session = c.session;
  const int64_t step = c.step;
  std::shared_ptr<Session> sp;
  int64_t closed_at = -1;
  PS_RETURN_IF_ERROR(find_or_create(session, c.world_size, &sp, &closed_at));
  if (sp == nullptr) return closed_reply(session, step, closed_at, committed);
  Session& s = *sp;
  grpc::Status applied_status;
  bool applied = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.dropped)  // close() won the race
      return closed_reply(session, step, s.committed.load(), committed);
    Stored stored;
    PS_RETURN_IF_ERROR(store(s, std::move(c), &stored));
    if (stored == Stored::kStepComplete) {
      applied_status = apply_step(s, session, step, rows_applied);
      applied = applied_status.ok();
    }
    *committed = s.committed.load();
  }
  if (!applied_status.ok()) {
    fail_waiters(session, applied_status);
    return applied_status;
  }
  if (applied) notify(session, *committed);
  return grpc::Status::OK;
}

grpc::Status CommitSessions::store(Session& s, CommitChunk&& c, Stored* out) {
  *out = Stored::kAcknowledged;
  PS_RETURN_IF_ERROR(check_step(s, c));
  if (c.step <= s.committed.load()) return grpc::Status::OK;  // a committed step's retry
  auto rit = s.ranks.find(c.rank);
  RankSlot* slot = rit != s.ranks.end() ? &rit->second : nullptr;
  bool retry = false;
  PS_RETURN_IF_ERROR(check_chunk(s, slot, c, &retry));
  if (retry) return grpc::Status::OK;  // an identical retry of a pending chunk
  if (!s.has_pending) {                // the step's first chunk fixes its lr and optimizer
    s.has_pending = true;
    s.lr = c.lr;
    s.optimizer = c.optimizer;
  }
  if (slot == nullptr) {
    slot = &s.ranks[c.rank];
    slot->chunk_count = c.chunk_count;
  }
  const uint32_t idx = c.chunk_index;
  slot->chunks.emplace(idx, std::move(c));
  if (slot->chunks.size() == slot->chunk_count) ++s.complete_ranks;
  *out = s.complete_ranks == s.world_size ? Stored::kStepComplete : Stored::kPending;
  return grpc::Status::OK;
}

grpc::Status CommitSessions::check_step(const Session& s, const CommitChunk& c) {
  using grpc::Status;
  using grpc::StatusCode;
  if (!s.failed.ok()) return s.failed;
  if (c.world_size != s.world_size)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("world_size ", c.world_size, " does not match session ", c.session,
                               " world_size ", s.world_size));
  const int64_t cur = s.committed.load();
  if (c.step > cur + 1)
    return Status(StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("out-of-order step ", c.step, " for session ", c.session,
                               ": committed step is ", cur, ", expected ", cur + 1));
  return Status::OK;
}

grpc::Status CommitSessions::check_chunk(const Session& s, const RankSlot* slot,
                                         const CommitChunk& c, bool* retry) {
  using grpc::Status;
  using grpc::StatusCode;
  if (slot != nullptr && slot->chunk_count != c.chunk_count)
    return Status(
        StatusCode::INVALID_ARGUMENT,
        absl::StrCat("chunk_count ", c.chunk_count, " differs from chunk_count ", slot->chunk_count,
                     " of session ", c.session, " step ", c.step, " rank ", c.rank));
  const auto stored = slot != nullptr ? slot->chunks.find(c.chunk_index)
                                      : std::map<uint32_t, CommitChunk>::const_iterator{};
  if (slot != nullptr && stored != slot->chunks.end()) {
    *retry = same_chunk(stored->second, c);
    return *retry ? Status::OK
                  : Status(StatusCode::ABORTED,
                           absl::StrCat("conflicting retry of session ", c.session, " step ",
                                        c.step, " rank ", c.rank, " chunk ", c.chunk_index));
  }
  if (s.has_pending &&
      (std::memcmp(&s.lr, &c.lr, sizeof(float)) != 0 || s.optimizer != c.optimizer))
    return Status(
        StatusCode::INVALID_ARGUMENT,
        absl::StrCat("lr ", c.lr, " / optimizer ", optimizer_name(c.optimizer), " differ from lr ",
                     s.lr, " / optimizer ", optimizer_name(s.optimizer), " of session ", c.session,
                     " step ", c.step));
  return Status::OK;
}

grpc::Status CommitSessions::apply_step(Session& s, uint64_t session, int64_t step,
                                        size_t* rows_applied) {
  // table.apply is all or nothing, so a throw means the step left no trace.
  grpc::StatusCode code;
  std::string why;
  try {
    *rows_applied = apply_pending(s);
    s.committed.store(step);
    return grpc::Status::OK;
  } catch (const TableFull& e) {
    code = grpc::StatusCode::RESOURCE_EXHAUSTED;
    why = e.what();
  } catch (const std::exception& e) {
    code = grpc::StatusCode::INTERNAL;
    why = e.what();
  }
  s.failed = grpc::Status(code, absl::StrCat("session ", session, " step ", step,
                                             " was not applied and the session failed: ", why));
  s.ranks.clear();  // nothing will ever apply them
  return s.failed;
}

size_t CommitSessions::apply_pending(Session& s) {
  const uint32_t dim = table_.dim();
  RowAccumulator acc(dim);
  for (auto& [rank, r] : s.ranks)  // rank order, then chunk order
    for (auto& [index, ch] : r.chunks)
      acc.add(ch.keys.data(), ch.grads.data(), ch.keys.size() / sizeof(int64_t));
  acc.divide(static_cast<float>(s.world_size));
  table_.apply(acc.keys().data(), acc.sums().data(), acc.size(), s.lr, s.optimizer);
  s.ranks.clear();
  s.complete_ranks = 0;
  s.has_pending = false;
  return acc.size();
}

void CommitSessions::notify(uint64_t session, int64_t committed) {
  std::vector<WaitCallback> ready;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.session == session && it->second.step <= committed) {
        ready.push_back(std::move(it->second.done));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& f : ready) f(committed, grpc::Status::OK);
}

void CommitSessions::fail_waiters(uint64_t session, const grpc::Status& status) {
  std::vector<WaitCallback> ready;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.session == session) {
        ready.push_back(std::move(it->second.done));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int64_t c = committed(session);
  for (auto& f : ready) f(c, status);
}

grpc::Status CommitSessions::state(uint64_t session, int64_t* committed_out) const {
  std::shared_ptr<Session> sp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      auto ct = closed_.find(session);
      *committed_out = ct != closed_.end() ? ct->second : -1;
      return ct != closed_.end() ? closed_status(session, ct->second) : grpc::Status::OK;
    }
    sp = it->second;
  }
  std::lock_guard<std::mutex> slock(sp->mu);
  *committed_out = sp->committed.load();
  if (!sp->failed.ok()) return sp->failed;
  if (sp->dropped) return closed_status(session, *committed_out);
  return grpc::Status::OK;
}

int64_t CommitSessions::committed(uint64_t session) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) return it->second->committed.load();
  auto ct = closed_.find(session);
  return ct != closed_.end() ? ct->second : -1;
}

uint64_t CommitSessions::wait(uint64_t session, int64_t step, Clock::time_point deadline,
                              WaitCallback done) {
  int64_t cur;
  grpc::Status st;
  {
    // Checked and registered under waiters_mu_: a close or failure after the check finds
    // this waiter in fail_waiters.
    std::lock_guard<std::mutex> lock(waiters_mu_);
    st = state(session, &cur);
    if (cur < step && st.ok()) {
      const uint64_t id = next_waiter_++;
      waiters_.emplace(id, Waiter{session, step, deadline, std::move(done)});
      return id;
    }
  }
  done(cur, cur >= step ? grpc::Status::OK : st);
  return 0;
}

bool CommitSessions::cancel_wait(uint64_t id) {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  return waiters_.erase(id) > 0;
}

void CommitSessions::expire_waiters(Clock::time_point now, bool all) {
  std::vector<std::pair<uint64_t, WaitCallback>> ready;
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (all || it->second.deadline <= now) {
        ready.emplace_back(it->second.session, std::move(it->second.done));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [session, f] : ready) f(committed(session), grpc::Status::OK);
}

grpc::Status CommitSessions::close(uint64_t session, uint32_t rank, int64_t* committed_out) {
  int64_t cur;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      auto ct = closed_.find(session);
      // Closing twice is harmless; so is closing a session that never committed here (a job
      // with zero steps, or a shard none of its chunks reached).
      *committed_out = ct != closed_.end() ? ct->second : -1;
      return grpc::Status::OK;
    }
    std::shared_ptr<Session> keep = it->second;  // outlives the lock below
    Session& s = *keep;
    std::lock_guard<std::mutex> slock(s.mu);
    if (rank >= s.world_size)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("rank ", rank, " out of range for session ", session,
                                       " world_size ", s.world_size));
    s.closed[rank] = true;
    bool all_closed = true;
    for (bool b : s.closed) all_closed = all_closed && b;
    cur = s.committed.load();
    *committed_out = cur;
    if (!all_closed && s.has_pending && s.failed.ok()) return grpc::Status::OK;
    s.dropped = true;  // a commit() holding a reference now refuses its chunk
    if (closed_.size() >= kMaxClosedRemembered) closed_.erase(closed_.begin());
    closed_[session] = cur;
    sessions_.erase(it);
  }
  // Outside mu_: long polls of the dropped session would otherwise wait out their deadline.
  fail_waiters(session, closed_status(session, cur));
  return grpc::Status::OK;
}

size_t CommitSessions::live_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace cpu_dist::ps
