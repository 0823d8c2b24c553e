// CommitSessions: long polls (waiters) and the ends of sessions (closed by their ranks,
// expired, evicted, aborted).  The chunk path is in commit.cc.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "commit.h"

namespace cpu_dist::ps {

namespace {
constexpr size_t kMaxEndedRemembered = 4096;
}  // namespace

using grpc::Status;
using grpc::StatusCode;

void CommitSessions::touch(Session& s) {
  s.last_active.store(Clock::now().time_since_epoch().count());
}

Status CommitSessions::ended_status(uint64_t session, const Ended& how) {
  std::string msg =
      absl::StrCat("session ", session, " is closed (committed step ", how.committed, ")");
  if (!how.why.empty()) absl::StrAppend(&msg, ": ", how.why);
  return Status(how.aborted ? StatusCode::ABORTED : StatusCode::FAILED_PRECONDITION, msg);
}

bool CommitSessions::end_session(uint64_t session, const std::shared_ptr<Session>& sp, Ended how) {
  {
    std::lock_guard<std::mutex> lock(sp->mu);
    if (sp->dropped) return false;
    sp->dropped = true;  // a commit() holding a reference now refuses its chunk
    sp->steps.clear();
    sp->bytes = 0;
    how.committed = sp->committed.load();
    how.base = sp->base_step;
  }
  forget(session, sp, how);
  return true;
}

void CommitSessions::forget(uint64_t session, const std::shared_ptr<Session>& sp,
                            const Ended& how) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it != sessions_.end() && it->second == sp) sessions_.erase(it);
    if (ended_.emplace(session, how).second) ended_order_.push_back(session);
    while (ended_order_.size() > kMaxEndedRemembered) {  // the oldest end is forgotten first
      ended_.erase(ended_order_.front());
      ended_order_.pop_front();
    }
  }
  // Outside mu_: long polls of the ended session would otherwise wait out their deadline.
  fail_waiters(session, ended_status(session, how));
}

Status CommitSessions::close(uint64_t session, uint32_t rank, int64_t* committed_out) {
  std::shared_ptr<Session> sp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      auto et = ended_.find(session);
      // Closing twice is harmless; so is closing a session that never committed here (a job
      // with zero steps, or a shard none of its chunks reached).
      *committed_out = et != ended_.end() ? et->second.committed : -1;
      return Status::OK;
    }
    sp = it->second;
  }
  Ended how;
  {
    std::lock_guard<std::mutex> slock(sp->mu);
    *committed_out = how.committed = sp->committed.load();
    how.base = sp->base_step;
    if (sp->dropped) return Status::OK;  // ended meanwhile
    if (rank >= sp->world_size)
      return Status(StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("rank ", rank, " out of range for session ", session,
                                 " world_size ", sp->world_size));
    touch(*sp);
    sp->closed[rank] = true;
    bool all_closed = true;
    for (bool b : sp->closed) all_closed = all_closed && b;
    if (!all_closed && !sp->steps.empty() && sp->failed.ok()) return Status::OK;
    sp->dropped = true;
    sp->steps.clear();
    sp->bytes = 0;
  }
  forget(session, sp, how);
  return Status::OK;
}

size_t CommitSessions::expire_idle(Clock::time_point now, Clock::duration idle) {
  const int64_t cutoff = (now - idle).time_since_epoch().count();
  std::vector<std::pair<uint64_t, std::shared_ptr<Session>>> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, sp] : sessions_)
      if (sp->last_active.load() < cutoff) stale.emplace_back(id, sp);
  }
  const double secs = std::chrono::duration<double>(idle).count();
  size_t ended = 0;
  for (const auto& [id, sp] : stale) {
    if (sp->last_active.load() >= cutoff) continue;  // active again since
    ended += end_session(
        id, sp, Ended{-1, absl::StrCat("expired after ", secs, " s without activity"), false, 0});
  }
  return ended;
}

size_t CommitSessions::abort_all() {
  std::vector<std::pair<uint64_t, std::shared_ptr<Session>>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open.assign(sessions_.begin(), sessions_.end());
  }
  size_t ended = 0;
  for (const auto& [id, sp] : open)
    ended += end_session(
        id, sp, Ended{-1, "aborted by AbortSessions (a job took the shard over)", true, 0});
  return ended;
}

size_t CommitSessions::live_sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

size_t CommitSessions::waiters() const {
  std::lock_guard<std::mutex> lock(waiters_mu_);
  return waiters_.size();
}

// ---- committed steps and long polls --------------------------------------------------------

Status CommitSessions::state(uint64_t session, int64_t* committed_out) const {
  std::shared_ptr<Session> sp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      auto et = ended_.find(session);
      *committed_out = et != ended_.end() ? et->second.committed : -1;
      return et != ended_.end() ? ended_status(session, et->second) : Status::OK;
    }
    sp = it->second;
  }
  std::lock_guard<std::mutex> slock(sp->mu);
  *committed_out = sp->committed.load();
  if (!sp->failed.ok()) return sp->failed;
  if (sp->dropped) return ended_status(session, Ended{*committed_out, "", false, sp->base_step});
  return Status::OK;
}

int64_t CommitSessions::committed(uint64_t session) const { return position(session).committed; }

CommitSessions::Position CommitSessions::position(uint64_t session) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    const int64_t c = it->second->committed.load();
    return {c, c >= 0 ? it->second->base_step : 0, true};
  }
  auto et = ended_.find(session);
  return {et != ended_.end() ? et->second.committed : -1, 0, false};
}

CommitSessions::Writes CommitSessions::writes(uint64_t session) const {
  std::shared_ptr<Session> sp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      auto et = ended_.find(session);
      if (et == ended_.end()) return {};
      // What others wrote since is no longer followed: rows past its last step are unknown.
      return {true, et->second.base, et->second.committed, std::numeric_limits<int64_t>::max()};
    }
    sp = it->second;
  }
  Writes w{true, sp->base_step, sp->begun.load(), sp->others_upto};
  // Own applies read first: one of its own counted in between only makes this conservative.
  const uint64_t own = sp->own_applies.load();
  if (applies_begun_.load() - sp->applies_before != own)
    w.others_upto = std::numeric_limits<int64_t>::max();  // another session applied meanwhile
  return w;
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
  for (auto& f : ready) f(committed, Status::OK);
}

void CommitSessions::fail_waiters(uint64_t session, const Status& status) {
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

uint64_t CommitSessions::wait(uint64_t session, int64_t step, Clock::time_point deadline,
                              WaitCallback done) {
  int64_t cur;
  Status st;
  {
    // Checked and registered under waiters_mu_: an end or failure after the check finds
    // this waiter in fail_waiters.
    std::lock_guard<std::mutex> lock(waiters_mu_);
    st = state(session, &cur);
    if (cur < step && st.ok()) {
      std::shared_ptr<Session> sp;
      {
        std::lock_guard<std::mutex> m(mu_);
        auto it = sessions_.find(session);
        if (it != sessions_.end()) sp = it->second;
      }
      if (sp) touch(*sp);  // a worker waiting on its job's step is activity
      const uint64_t id = next_waiter_++;
      waiters_.emplace(id, Waiter{session, step, deadline, std::move(done)});
      return id;
    }
  }
  done(cur, cur >= step ? Status::OK : st);
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
  for (auto& [session, f] : ready) f(committed(session), Status::OK);
}

}  // namespace cpu_dist::ps
