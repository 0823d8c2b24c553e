#include "commit.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "merge.h"

namespace cpu_dist::ps {

namespace {
constexpr size_t kMaxClosedRemembered = 4096;

bool same_chunk(const CommitChunk& a, const CommitChunk& b) {
  return a.chunk_count == b.chunk_count &&
         std::memcmp(&a.lr, &b.lr, sizeof(float)) == 0 && a.optimizer == b.optimizer &&
         a.keys == b.keys && a.grads == b.grads;
}
}  // namespace

std::shared_ptr<CommitSessions::Session> CommitSessions::find_or_create(uint64_t session,
                                                                         uint32_t world_size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) return it->second;
  // A session id used again after it was dropped starts afresh.
  closed_.erase(session);
  auto s = std::make_shared<Session>();
  s->world_size = world_size;
  s->ranks.resize(world_size);
  s->closed.assign(world_size, false);
  sessions_.emplace(session, s);
  return s;
}

grpc::Status CommitSessions::commit(CommitChunk&& c, int64_t* committed, size_t* rows_applied) {
  using grpc::Status;
  using grpc::StatusCode;
  *rows_applied = 0;
  if (c.world_size == 0)
    return Status(StatusCode::INVALID_ARGUMENT, "world_size must be >= 1, got 0");
  if (c.rank >= c.world_size)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("rank ", c.rank, " out of range for world_size ", c.world_size));
  if (c.chunk_count == 0)
    return Status(StatusCode::INVALID_ARGUMENT, "chunk_count must be >= 1, got 0");
  if (c.chunk_index >= c.chunk_count)
    return Status(StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("chunk_index ", c.chunk_index, " out of range for chunk_count ",
                               c.chunk_count));
  if (c.step < 0)
    return Status(StatusCode::INVALID_ARGUMENT, absl::StrCat("step must be >= 0, got ", c.step));

  std::shared_ptr<Session> sp = find_or_create(c.session, c.world_size);
  Session& s = *sp;
  const uint64_t session = c.session;
  int64_t now_committed;
  bool applied = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const int64_t cur = s.committed.load();
    if (c.world_size != s.world_size)
      return Status(StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("world_size ", c.world_size, " does not match session ", session,
                                 " world_size ", s.world_size));
    if (c.step <= cur) {  // a retry of a committed step: acknowledged, nothing re-applied
      *committed = cur;
      return Status::OK;
    }
    if (c.step > cur + 1)
      return Status(StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("out-of-order step ", c.step, " for session ", session,
                                 ": committed step is ", cur, ", expected ", cur + 1));
    RankSlot& slot = s.ranks[c.rank];
    if (slot.chunk_count != 0 && slot.chunk_count != c.chunk_count)
      return Status(StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("chunk_count ", c.chunk_count, " differs from chunk_count ",
                                 slot.chunk_count, " of session ", session, " step ", c.step,
                                 " rank ", c.rank));
    if (slot.chunk_count != 0 && slot.chunks[c.chunk_index].has_value()) {
      if (!same_chunk(*slot.chunks[c.chunk_index], c))
        return Status(StatusCode::ABORTED,
                      absl::StrCat("conflicting retry of session ", session, " step ", c.step,
                                   " rank ", c.rank, " chunk ", c.chunk_index));
      *committed = cur;
      return Status::OK;
    }
    if (s.has_pending && (std::memcmp(&s.lr, &c.lr, sizeof(float)) != 0 ||
                          s.optimizer != c.optimizer))
      return Status(StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("lr ", c.lr, " / optimizer ", optimizer_name(c.optimizer),
                                 " differ from lr ", s.lr, " / optimizer ",
                                 optimizer_name(s.optimizer), " of session ", session,
                                 " step ", c.step));
    // Accepted: store it.
    if (!s.has_pending) {
      s.has_pending = true;
      s.lr = c.lr;
      s.optimizer = c.optimizer;
    }
    if (slot.chunk_count == 0) {
      slot.chunk_count = c.chunk_count;
      slot.chunks.assign(c.chunk_count, std::nullopt);
    }
    const uint32_t idx = c.chunk_index;
    slot.chunks[idx] = std::move(c);
    ++slot.received;
    bool complete = true;
    for (const RankSlot& r : s.ranks)
      if (r.chunk_count == 0 || r.received != r.chunk_count) complete = false;
    if (complete) {
      *rows_applied = apply_pending(s);
      s.committed.store(cur + 1);
      applied = true;
    }
    now_committed = s.committed.load();
  }
  *committed = now_committed;
  if (applied) notify(session, now_committed);
  return Status::OK;
}

size_t CommitSessions::apply_pending(Session& s) {
  const uint32_t dim = table_.dim();
  RowAccumulator acc(dim);
  for (RankSlot& r : s.ranks)
    for (auto& ch : r.chunks)
      acc.add(ch->keys.data(), ch->grads.data(), ch->keys.size() / sizeof(int64_t));
  acc.divide(static_cast<float>(s.world_size));
  table_.apply(acc.keys().data(), acc.sums().data(), acc.size(), s.lr, s.optimizer);
  for (RankSlot& r : s.ranks) r = RankSlot{};
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
  for (auto& f : ready) f(committed);
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
  {
    std::lock_guard<std::mutex> lock(waiters_mu_);
    cur = committed(session);
    if (cur < step) {
      const uint64_t id = next_waiter_++;
      waiters_.emplace(id, Waiter{session, step, deadline, std::move(done)});
      return id;
    }
  }
  done(cur);
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
  for (auto& [session, f] : ready) f(committed(session));
}

grpc::Status CommitSessions::close(uint64_t session, uint32_t rank, int64_t* committed_out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    auto ct = closed_.find(session);
    if (ct != closed_.end()) {  // closing twice is harmless
      *committed_out = ct->second;
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown session ", session));
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
  const int64_t cur = s.committed.load();
  *committed_out = cur;
  if (all_closed || !s.has_pending) {
    if (closed_.size() >= kMaxClosedRemembered) closed_.erase(closed_.begin());
    closed_[session] = cur;
    sessions_.erase(it);
  }
  return grpc::Status::OK;
}

size_t CommitSessions::live_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace cpu_dist::ps
