// CommitSessions: the chunk path (validation, the step window, held steps, application).
// Waiters and the ends of sessions are in sessions.cc.
#include "commit.h"

#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "merge.h"
#include "status_util.h"

namespace cpu_dist::ps {

namespace {

using grpc::Status;
using grpc::StatusCode;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The same tables, in the same order, with the same lr and optimizer (and with `counts`, the
// same keys of each).
bool same_parts(const std::vector<ChunkPart>& a, const std::vector<ChunkPart>& b, bool counts) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].table != b[i].table || !same_bits(a[i].lr, b[i].lr) ||
        a[i].optimizer != b[i].optimizer || (counts && a[i].count != b[i].count))
      return false;
  return true;
}

bool same_chunk(const CommitChunk& a, const CommitChunk& b) {
  return a.chunk_count == b.chunk_count && same_parts(a.parts, b.parts, true) && a.keys == b.keys &&
         a.grads == b.grads;
}

std::string describe_parts(const std::vector<ChunkPart>& parts) {
  std::string out;
  for (const ChunkPart& p : parts)
    absl::StrAppend(&out, out.empty() ? "" : ", ", "'", p.table->spec().name, "' (lr ", p.lr, ", ",
                    optimizer_name(p.optimizer), ")");
  return out;
}

// A chunk for an ended session: a retry of a committed step is acknowledged, nothing else.
Status ended_reply(const Status& ended, int64_t step, int64_t final_step, int64_t* committed) {
  if (step > final_step) return ended;
  *committed = final_step;
  return Status::OK;
}

// f(t, keys, grads, count) for each table's part of chunk `ch`, in table order; `keys` and
// `grads` point into the chunk's bytes (not necessarily aligned).
template <class F>
void for_each_part(const CommitChunk& ch, const std::vector<ChunkPart>& tables, F&& f) {
  const char* k = ch.keys.data();
  const char* g = ch.grads.data();
  for (size_t t = 0; t < tables.size(); ++t) {  // same tables as the step's (check_chunk)
    const size_t cnt = ch.parts[t].count;
    f(t, k, g, cnt);
    k += cnt * sizeof(int64_t);
    g += cnt * tables[t].table->dim() * sizeof(float);
  }
}

}  // namespace

Status CommitSessions::find_or_create(const CommitChunk& c, std::shared_ptr<Session>* out,
                                      Ended* ended, bool wait) {
  const uint64_t session = c.session;
  for (;;) {
    std::shared_ptr<Session> victim;
    uint64_t victim_id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      out->reset();
      auto it = sessions_.find(session);
      if (it != sessions_.end()) {
        *out = it->second;
        return Status::OK;
      }
      // A late chunk must not bring an ended session back (at committed -1).
      auto et = ended_.find(session);
      if (et != ended_.end()) {
        *ended = et->second;
        return Status::OK;
      }
      if (sessions_.size() < limits_.max_sessions) {
        auto s = std::make_shared<Session>();
        s->world_size = c.world_size;
        s->base_step = c.base_step;
        // Read in this order: an apply counted in applies_before noted its step before.
        s->applies_before = applies_begun_.load();
        s->others_upto = tables_.max_step();
        s->closed.assign(c.world_size, false);
        touch(*s);
        sessions_.emplace(session, s);
        *out = std::move(s);
        return Status::OK;
      }
      // At the cap: the least recently active session makes room (a crashed job's, usually);
      // ending it takes its mutex, which an applying step may hold.
      if (!wait) throw WouldBlock();
      for (const auto& [id, sp] : sessions_)
        if (!victim || sp->last_active.load() < victim->last_active.load()) {
          victim = sp;
          victim_id = id;
        }
    }
    end_session(victim_id, victim,
                Ended{-1,
                      absl::StrCat("evicted, the least recently active of ", limits_.max_sessions,
                                   " live sessions, to make room for session ", session),
                      false, 0});
  }
}

Status CommitSessions::validate(const CommitChunk& c) {
  if (c.world_size == 0) return invalid("world_size must be >= 1, got 0");
  if (c.world_size > kMaxWorldSize)
    return invalid(absl::StrCat("world_size ", c.world_size, " exceeds ", kMaxWorldSize));
  if (c.rank >= c.world_size)
    return invalid(absl::StrCat("rank ", c.rank, " out of range for world_size ", c.world_size));
  if (c.chunk_count == 0) return invalid("chunk_count must be >= 1, got 0");
  if (c.chunk_count > kMaxChunkCount)
    return invalid(absl::StrCat("chunk_count ", c.chunk_count, " exceeds ", kMaxChunkCount));
  if (c.chunk_index >= c.chunk_count)
    return invalid(absl::StrCat("chunk_index ", c.chunk_index, " out of range for chunk_count ",
                                c.chunk_count));
  if (c.step < 0 || c.step > kMaxStep)
    return invalid(absl::StrCat("step must be in 0..2^62, got ", c.step));
  if (c.base_step < 0 || c.base_step > kMaxStep)
    return invalid(absl::StrCat("base_step must be in 0..2^62, got ", c.base_step));
  if (c.max_ahead > kMaxAhead)
    return invalid(absl::StrCat("max_ahead ", c.max_ahead, " exceeds ", kMaxAhead));
  return Status::OK;
}

Status CommitSessions::commit(CommitChunk&& c, int64_t* committed, size_t* rows_applied,
                              bool wait) {
  *rows_applied = 0;
  PS_RETURN_IF_ERROR(validate(c));
  const uint64_t session = c.session;
  const int64_t step = c.step;
  std::shared_ptr<Session> sp;
  Ended ended;
  PS_RETURN_IF_ERROR(find_or_create(c, &sp, &ended, wait));
  if (sp == nullptr)
    return ended_reply(ended_status(session, ended), step, ended.committed, committed);
  Session& s = *sp;
  Status applied_status;
  bool applied = false;
  bool blocked = false;
  {
    std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
    // without wait, WouldBlock while a step of the session is being applied
    lock_or_would_block(lock, wait);
    if (s.dropped)  // the session ended while this chunk was on its way in
      return ended_reply(ended_status(session, Ended{s.committed.load(), "", false, s.base_step}),
                         step, s.committed.load(), committed);
    touch(s);
    Stored stored;
    const bool was_failed = !s.failed.ok();
    Status st = store(s, std::move(c), &stored);
    if (!st.ok() && !was_failed && !s.failed.ok()) {
      applied_status = st;  // this chunk failed the session: its waiters hear of it below
    } else if (!st.ok()) {
      return st;
    } else if (stored != Stored::kHeld) {
      // The pending step may be complete: this chunk completed it, or it retries a chunk of
      // one whose apply was left to a call that may wait.
      size_t steps = 0;
      applied_status = apply_ready(s, session, rows_applied, &steps, wait, &blocked);
      applied = applied_status.ok() && steps > 0;
    }
    *committed = s.committed.load();
  }
  if (blocked) {
    if (applied) notify(session, *committed);  // the steps before the one left to wait
    throw WouldBlock();
  }
  if (!applied_status.ok()) {
    notify(session, *committed);  // the steps that did apply (one failing after its apply too)
    fail_waiters(session, applied_status);
    return applied_status;
  }
  if (applied) notify(session, *committed);
  return Status::OK;
}

Status CommitSessions::store(Session& s, CommitChunk&& c, Stored* out) {
  *out = Stored::kAcknowledged;
  PS_RETURN_IF_ERROR(check_step(s, c));
  const int64_t cur = s.committed.load();
  if (c.step <= cur) return Status::OK;  // a committed step's retry
  auto sit = s.steps.find(c.step);
  StepChunks* step = sit != s.steps.end() ? &sit->second : nullptr;
  RankSlot* slot = nullptr;
  if (step != nullptr) {
    auto rit = step->ranks.find(c.rank);
    if (rit != step->ranks.end()) slot = &rit->second;
  }
  bool retry = false;
  PS_RETURN_IF_ERROR(check_chunk(step, slot, c, &retry));
  if (retry) return Status::OK;  // an identical retry of a stored chunk
  const uint64_t bytes = c.keys.size() + c.grads.size();
  PS_RETURN_IF_ERROR(check_held_bytes(s, c, bytes));
  PS_RETURN_IF_ERROR(check_pending_bytes(s, c, bytes));
  if (step == nullptr) {  // the step's first chunk fixes its tables, lr and optimizer
    step = &s.steps[c.step];
    step->tables = c.parts;
  }
  if (slot == nullptr) {
    slot = &step->ranks[c.rank];
    slot->chunk_count = c.chunk_count;
  }
  const uint32_t idx = c.chunk_index;
  const int64_t at = c.step;
  slot->chunks.emplace(idx, std::move(c));
  step->bytes += bytes;
  s.bytes += bytes;
  if (slot->chunks.size() == slot->chunk_count) ++step->complete_ranks;
  const bool ready = at == cur + 1 && step->complete_ranks == s.world_size;
  *out = ready ? Stored::kStepReady : Stored::kHeld;
  return Status::OK;
}

Status CommitSessions::check_step(const Session& s, const CommitChunk& c) {
  if (!s.failed.ok()) return s.failed;
  if (c.world_size != s.world_size)
    return invalid(absl::StrCat("world_size ", c.world_size, " does not match session ", c.session,
                                " world_size ", s.world_size));
  if (c.base_step != s.base_step)
    return invalid(absl::StrCat("base_step ", c.base_step, " does not match session ", c.session,
                                " base_step ", s.base_step, " (it is constant per session)"));
  const int64_t cur = s.committed.load();
  const int64_t ahead = c.max_ahead == 0 ? 1 : c.max_ahead;
  if (c.step > cur + ahead)
    return Status(StatusCode::FAILED_PRECONDITION,
                  absl::StrCat("out-of-order step ", c.step, " for session ", c.session,
                               ": committed step is ", cur, ", the window (max_ahead ", ahead,
                               ") accepts steps ", cur + 1, "..", cur + ahead));
  return Status::OK;
}

Status CommitSessions::check_chunk(const StepChunks* step, const RankSlot* slot,
                                   const CommitChunk& c, bool* retry) {
  if (slot != nullptr && slot->chunk_count != c.chunk_count)
    return invalid(absl::StrCat("chunk_count ", c.chunk_count, " differs from chunk_count ",
                                slot->chunk_count, " of session ", c.session, " step ", c.step,
                                " rank ", c.rank));
  if (slot != nullptr) {
    const auto stored = slot->chunks.find(c.chunk_index);
    if (stored != slot->chunks.end()) {
      *retry = same_chunk(stored->second, c);
      return *retry ? Status::OK
                    : Status(StatusCode::ABORTED,
                             absl::StrCat("conflicting retry of session ", c.session, " step ",
                                          c.step, " rank ", c.rank, " chunk ", c.chunk_index));
    }
  }
  if (step == nullptr || same_parts(step->tables, c.parts, false)) return Status::OK;
  if (step->tables.size() == 1 && c.parts.size() == 1 && step->tables[0].table == c.parts[0].table)
    return invalid(absl::StrCat(
        "lr ", c.parts[0].lr, " / optimizer ", optimizer_name(c.parts[0].optimizer),
        " differ from lr ", step->tables[0].lr, " / optimizer ",
        optimizer_name(step->tables[0].optimizer), " of session ", c.session, " step ", c.step));
  return invalid(absl::StrCat("the tables ", describe_parts(c.parts), " differ from the tables ",
                              describe_parts(step->tables), " of session ", c.session, " step ",
                              c.step,
                              " (every chunk of a step names the same tables, lr and "
                              "optimizers)"));
}

Status CommitSessions::check_held_bytes(const Session& s, const CommitChunk& c,
                                        uint64_t bytes) const {
  const int64_t pending = s.committed.load() + 1;
  if (c.step == pending) return Status::OK;  // check_pending_bytes
  auto pit = s.steps.find(pending);
  const uint64_t held = s.bytes - (pit != s.steps.end() ? pit->second.bytes : 0);
  if (held + bytes <= limits_.max_held_bytes) return Status::OK;
  return Status(StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat("session ", c.session, " step ", c.step, " rank ", c.rank,
                             ": holding this chunk (", bytes, " bytes) beside the ", held,
                             " bytes held for steps after ", pending,
                             " would exceed max_held_bytes ", limits_.max_held_bytes));
}

Status CommitSessions::check_pending_bytes(Session& s, const CommitChunk& c, uint64_t bytes) const {
  const int64_t pending = s.committed.load() + 1;
  if (c.step != pending) return Status::OK;  // check_held_bytes
  auto pit = s.steps.find(pending);
  const uint64_t stored = pit != s.steps.end() ? pit->second.bytes : 0;
  if (stored + bytes <= limits_.max_pending_bytes) return Status::OK;
  // Refusing the chunk alone would leave a step that can never complete: the session fails.
  s.failed = Status(
      StatusCode::RESOURCE_EXHAUSTED,
      absl::StrCat("session ", c.session, " step ", c.step, " rank ", c.rank, " chunk ",
                   c.chunk_index, ": storing it (", bytes, " bytes) beside the ", stored,
                   " bytes of the pending step would exceed max_pending_bytes ",
                   limits_.max_pending_bytes, "; the step was not applied and the session failed"));
  s.steps.clear();
  s.bytes = 0;
  return s.failed;
}

Status CommitSessions::apply_ready(Session& s, uint64_t session, size_t* rows_applied,
                                   size_t* steps, bool wait, bool* blocked) {
  // table.apply is all or nothing, so a throw means the step left no trace.
  *steps = 0;
  *blocked = false;
  while (!s.steps.empty()) {
    auto it = s.steps.begin();
    const int64_t step = it->first;
    if (step != s.committed.load() + 1 || it->second.complete_ranks != s.world_size) break;
    StatusCode code;
    std::string why;
    try {
      const Clock::time_point t0 = Clock::now();
      *rows_applied += apply_step(s, step, it->second, wait);
      const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
      apply_ns_.fetch_add(static_cast<uint64_t>(took.count()), std::memory_order_relaxed);
      applied_steps_.fetch_add(1, std::memory_order_relaxed);
      s.bytes -= it->second.bytes;
      s.steps.erase(it);
      s.committed.store(step);
      ++*steps;
      continue;
    } catch (const WouldBlock&) {
      *blocked = true;
      return Status::OK;
    } catch (const AppliedThenFailed& e) {
      // The step is in the rows: committed says so, and the session fails all the same.
      s.committed.store(step);
      s.failed = Status(e.no_space() ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::INTERNAL,
                        absl::StrCat("session ", session, " step ", step,
                                     " was applied, then the session failed: ", e.what()));
      s.steps.clear();
      s.bytes = 0;
      return s.failed;
    } catch (const TableFull& e) {
      code = StatusCode::RESOURCE_EXHAUSTED;
      why = e.what();
    } catch (const TierError& e) {
      code = e.no_space() ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::INTERNAL;
      why = e.what();
    } catch (const std::exception& e) {
      code = StatusCode::INTERNAL;
      why = e.what();
    }
    s.failed = Status(code, absl::StrCat("session ", session, " step ", step,
                                         " was not applied and the session failed: ", why));
    s.steps.clear();  // nothing will ever apply them
    s.bytes = 0;
    return s.failed;
  }
  return Status::OK;
}

// Every rank's chunks whose keys rise strictly in every table, chunk after chunk (each worker
// sends its sorted unique keys): per table the ranks' rows are merged, summed per key in rank
// order, then / world_size (not for a world of one), without the accumulator's per-row hash
// insert.  Bit for bit the same rows as accumulate's, in key order.  False, with nothing
// filled, otherwise.
bool CommitSessions::merge_rising(const StepChunks& chunks, uint32_t world_size,
                                  std::vector<std::vector<int64_t>>& keys,
                                  std::vector<std::vector<float>>& grads) {
  const size_t nt = chunks.tables.size();
  std::vector<std::vector<RisingRun>> runs(nt, std::vector<RisingRun>(chunks.ranks.size()));
  size_t r = 0;
  for (const auto& [rank, slot] : chunks.ranks) {  // rank order, then chunk order
    for (const auto& [index, ch] : slot.chunks)
      for_each_part(ch, chunks.tables, [&](size_t t, const char* k, const char* g, size_t cnt) {
        runs[t][r].add(k, g, cnt, chunks.tables[t].table->dim());
      });
    for (size_t t = 0; t < nt; ++t)
      if (!runs[t][r].rising) return false;
    ++r;
  }
  keys.assign(nt, {});
  grads.assign(nt, {});
  for (size_t t = 0; t < nt; ++t) {
    merge_runs(runs[t], chunks.tables[t].table->dim(), keys[t], grads[t]);
    if (world_size != 1)
      for (float& v : grads[t]) v /= static_cast<float>(world_size);
  }
  return true;
}

void CommitSessions::accumulate(const StepChunks& chunks, uint32_t world_size,
                                std::vector<RowAccumulator>& acc) {
  const size_t nt = chunks.tables.size();
  std::vector<size_t> n(nt, 0);  // an upper bound of each table's rows: no regrowth
  for (const auto& [rank, r] : chunks.ranks)
    for (const auto& [index, ch] : r.chunks)
      for (size_t t = 0; t < nt; ++t) n[t] += ch.parts[t].count;
  for (size_t t = 0; t < nt; ++t) acc[t].reserve(n[t]);
  for (const auto& [rank, r] : chunks.ranks)  // rank order, then chunk order
    for (const auto& [index, ch] : r.chunks)
      for_each_part(ch, chunks.tables, [&](size_t t, const char* k, const char* g, size_t cnt) {
        acc[t].add(k, g, cnt);
      });
  for (RowAccumulator& a : acc) a.divide(static_cast<float>(world_size));
}

size_t CommitSessions::apply_step(Session& s, int64_t step, StepChunks& chunks, bool wait) {
  const size_t nt = chunks.tables.size();
  std::vector<StepUpdate> updates(nt);
  size_t rows = 0;
  // Per table: the chunks' rows summed in rank order, then chunk order (as one table's), by
  // merging where every rank's keys rise (the usual case), else through the accumulator.
  std::vector<std::vector<int64_t>> keys;
  std::vector<std::vector<float>> grads;
  std::vector<RowAccumulator> acc;
  if (merge_rising(chunks, s.world_size, keys, grads)) {
    for (size_t t = 0; t < nt; ++t) {
      const ChunkPart& p = chunks.tables[t];
      updates[t] =
          StepUpdate{p.table, keys[t].data(), grads[t].data(), keys[t].size(), p.lr, p.optimizer};
      rows += keys[t].size();
    }
  } else {
    acc.reserve(nt);
    for (const ChunkPart& t : chunks.tables) acc.emplace_back(t.table->dim());
    accumulate(chunks, s.world_size, acc);
    for (size_t t = 0; t < nt; ++t) {
      const ChunkPart& p = chunks.tables[t];
      updates[t] = StepUpdate{p.table, acc[t].keys().data(), acc[t].sums().data(), acc[t].size(),
                              p.lr,    p.optimizer};
      rows += acc[t].size();
    }
  }
  // Before any row holds the step (Writes): the tables' highest step, then the counts, then
  // the session's own bound.
  const int64_t job_step = s.base_step + step;
  for (const ChunkPart& t : chunks.tables) t.table->note_step(job_step);
  applies_begun_.fetch_add(1);
  s.own_applies.fetch_add(1);
  s.begun.store(step);
  // The step rules count on job steps: the session's step 0 is job step base_step.
  commit_tables_step(updates, job_step, wait);
  return rows;
}

}  // namespace cpu_dist::ps
