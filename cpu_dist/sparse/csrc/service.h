// The methods of one shard: request validation, the table, commit sessions, counters.  The
// gRPC plumbing (a generic callback service that checks the token before it reads a request)
// is in call_reactor.h; here every method is a function from the request's bytes to the
// reply's bytes, so that the service, not gRPC, decides what a malformed request gets (a
// precise INVALID_ARGUMENT), and so that Pull's reply is written by hand straight from the
// table without a protobuf copy of the payload.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "checkpoint.h"
#include "codec.h"
#include "commit.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "paging.h"
#include "ps.pb.h"
#include "table.h"
#include "tables.h"
#include "test_hooks.h"
#include "token.h"

namespace cpu_dist::ps {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // The one table the shard's flags declare (a job without a job file): with dim > 0 and no
  // `tables`, the shard holds `table` of dim, seed, init_scale and the rules below, whose
  // optimizer each request names (ShardTableSpec::flag_declared).
  uint32_t dim = 0;
  std::string token;
  std::string table = "embedding";
  uint64_t seed = 0;
  float init_scale = 0.0f;
  // The tables of the shard instead (then dim must be 0; admit_after, expire_after and seed
  // are each spec's).  Neither: no table until CreateTables.
  std::vector<ShardTableSpec> tables;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int max_message_bytes = 64 << 20;
  uint32_t stripes = 16;
  uint32_t max_blocks_per_stripe = 65536;  // capacity cap (table.h); at most 65536
  // Save/Load read and write files under this directory only; empty: both are refused.
  std::string checkpoint_dir;
  // Commit sessions idle this long are ended (a crashed job's); 0: never.
  double session_idle_timeout_s = 0.0;
  uint32_t max_sessions = 1024;             // live sessions; the least recently active makes room
  uint64_t max_held_bytes = 1ull << 30;     // per session: chunks held for later steps
  uint64_t max_pending_bytes = 1ull << 30;  // per session: the pending step's chunks
  // gRPC's memory quota for the server (transport buffers) and the HTTP/2 streams one
  // connection may have open at once.
  uint64_t max_memory_bytes = 4ull << 30;
  uint32_t max_concurrent_streams = 256;
  // Tiers (table.h): DRAM rows (0: unbounded) and the SSD tier's parent directory (empty:
  // none); the step rules (table_rules.h): admit_after N (0, 1: off), expire_after S (0: off).
  uint64_t memory_rows = 0;
  uint64_t memory_bytes = 0;  // the shard's DRAM budget in bytes, every table's (0: none)
  std::string ssd_dir;
  uint32_t admit_after = 0;
  uint32_t expire_after = 0;
  // Test-only: pause points a test arms (test_hooks.h).  Never set outside tests.
  bool test_hooks = false;
};

struct Counters {
  std::atomic<uint64_t> pull_calls{0}, pull_keys{0}, push_calls{0}, push_keys{0}, commit_calls{0},
      commit_keys{0}, errors{0}, bytes_in{0}, bytes_out{0};
};

enum class Method {
  kPull,
  kPush,
  kCommit,
  kWaitCommitted,
  kPullCommitted,
  kCloseSession,
  kAbortSessions,
  kStats,
  kHealth,
  kDump,
  kShutdown,
  kSave,
  kLoad,
  kCreateTables,
};

// The method a call path ("/cpu_dist.ps.ParameterServer/Pull") names, if any.
std::optional<Method> method_of(const std::string& path);

class PsService {
 public:
  using BB = grpc::ByteBuffer;
  using Clock = CommitSessions::Clock;

  // `on_shutdown` is called (once per Shutdown RPC, after validation) from a gRPC thread;
  // it must not block on the server draining.
  PsService(const ServerOptions& opts, std::function<void()> on_shutdown);

  const ServerOptions& options() const { return opts_; }
  StatsResponse stats() const;
  CommitSessions& sessions() { return sessions_; }
  TestHooks* test_hooks() { return hooks_.get(); }  // null unless ServerOptions::test_hooks

  // The token of a call's metadata (null: none), compared in constant time.
  grpc::Status check_token(const std::string* token) const;
  // Runs a unary method (every one but WaitCommitted) on a request's bytes.  With `deferred`
  // (Push and Commit on a callback thread) it waits on no lock: where it would, it sets
  // *deferred and leaves resp alone, and the caller runs it again without `deferred` on a
  // thread that may wait (the request as it came: Commit's chunk may be stored already, and
  // an identical retry finishes its step).
  grpc::Status run(Method m, const BB& req, BB* resp, bool* deferred = nullptr);
  // WaitCommitted: parses the request and parks `done` as a waiter until the step commits
  // or `deadline`; may call it at once.  Returns the waiter id (0: done already called), or
  // a non-OK status (and does not call `done`) when the request is refused.
  grpc::Status start_wait(const BB& req, Clock::time_point deadline,
                          CommitSessions::WaitCallback done, uint64_t* waiter);
  // PullCommitted: parses and checks the pull (refused at once, `done` not called, when it
  // names no session or after_step, or as Pull refuses it), then parks it as start_wait
  // does.  `done` gets the call's status once the step commits (the rows then gathered into
  // *resp on the thread that committed it), the session fails, or at `deadline`.
  grpc::Status start_pull_committed(const BB& req, Clock::time_point deadline, BB* resp,
                                    std::function<void(const grpc::Status&)> done,
                                    uint64_t* waiter);
  // Counts a finished call: bytes in (and out when OK), errors.
  void count(const BB* req, const BB* resp, const grpc::Status& status);

 private:
  grpc::Status dispatch(Method m, const BB& req, BB* resp, bool wait);  // run() less its catch
  // f()'s status, or what it threw past its own checks (the SSD tier failing, memory) as one.
  template <class F>
  static grpc::Status guarded(F&& f);
  // The bodies, each run after the shared preamble (parse, table, dim).
  grpc::Status do_pull(PullRequest& r, BB* resp);
  grpc::Status do_push(PushRequest& r, BB* resp, bool wait);
  grpc::Status do_commit(CommitRequest& r, BB* resp, bool wait);
  grpc::Status do_close(CloseSessionRequest& r, BB* resp);
  grpc::Status do_abort(AbortSessionsRequest& r, BB* resp);
  grpc::Status do_stats(StatsRequest& r, BB* resp);
  grpc::Status do_health(HealthRequest& r, BB* resp);
  grpc::Status do_dump(DumpRequest& r, BB* resp);
  grpc::Status do_shutdown(ShutdownRequest& r, BB* resp);
  grpc::Status do_save(SaveRequest& r, BB* resp);
  grpc::Status do_load(LoadRequest& r, BB* resp);
  grpc::Status do_create_tables(CreateTablesRequest& r, BB* resp);
  grpc::Status load_files(LoadRequest& r, BB* resp);    // stages LOAD, PREPARE
  grpc::Status finish_load(LoadStage stage, BB* resp);  // stages COMMIT, ABORT
  // The table a format 2 Save/Load names: FAILED_PRECONDITION unless it is the shard's one
  // table, keyed like the default one with one state float a row (what format 2 holds).
  grpc::Status checkpoint_table(const std::string& name, ShardTable** out) const;
  // `rel` inside the checkpoint directory (no absolute path, no "..") -> full path.
  grpc::Status checkpoint_path(const std::string& rel, std::string* full) const;

  // Parses the request (each method resolves its tables itself: resolve_parts, find_table).
  template <class Req>
  grpc::Status admit(const BB& req, Req* r) const;
  template <class Req>
  grpc::Status call(const BB& req, BB* resp, grpc::Status (PsService::*body)(Req&, BB*));

  // A request's share of one table: keys [begin, begin + count) of its keys, their rows (at
  // the table's dim) in the same order in grads and in the reply; lr and the optimizer of an
  // update.  One-table requests have one part.
  struct Part {
    ShardTable* table = nullptr;
    size_t begin = 0;
    size_t count = 0;
    float lr = 0.0f;
    OptimizerKind kind = OptimizerKind::kSgd;
  };
  // The request's parts: without `parts`, the one table `table` of `dim` (the one-table
  // form); with them, each part's table (NOT_FOUND naming it), its dim, counts summing to the
  // n keys, no table twice.  With `update`: every part's lr finite and > 0, and its optimizer
  // (kind_for).  Errors name the table.
  grpc::Status resolve_parts(const std::string& table, uint32_t dim,
                             const google::protobuf::RepeatedPtrField<TablePart>& parts, size_t n,
                             bool update, float lr, int optimizer, std::vector<Part>* out) const;
  // What a pull asks, checked: its key count, its parts, the reply's encoding.
  grpc::Status check_pull(const PullRequest& r, size_t* n, std::vector<Part>* parts,
                          Encoding* enc) const;
  // The table named `name` (NOT_FOUND naming it and the shard's tables).
  grpc::Status find_table(const std::string& name, ShardTable** out) const;
  // The optimizer an update of `t` runs: the spec's (a request naming another is refused), or
  // for a flag-declared table the request's (sgd, rowwise_adagrad), as before tables.
  grpc::Status kind_for(const ShardTable& t, int optimizer, OptimizerKind* kind) const;
  // Keys a multiple of 8 bytes (*n of them).
  grpc::Status check_keys(const std::string& keys, size_t* n) const;
  // grads one row per key of every part, at the part's dim, encoded as `enc`.
  grpc::Status check_grads(const std::vector<Part>& parts, const std::string& grads,
                           Encoding enc) const;
  grpc::Status check_encoding(int compression, Encoding* enc) const;
  // Bytes of decoded gradients a request holds beside its (encoded) message, counted against
  // max_memory_bytes with every other request's before they are allocated; released when
  // the request is done (what a session keeps of them is bounded by its own limits).
  class DecodeBudget {
   public:
    explicit DecodeBudget(std::atomic<uint64_t>& in_use) : in_use_(in_use) {}
    ~DecodeBudget() { in_use_.fetch_sub(bytes_); }
    DecodeBudget(const DecodeBudget&) = delete;
    DecodeBudget& operator=(const DecodeBudget&) = delete;
    // False (nothing reserved) when `bytes` more would exceed `limit`.
    bool reserve(uint64_t bytes, uint64_t limit, uint64_t* in_use_before);

   private:
    std::atomic<uint64_t>& in_use_;
    uint64_t bytes_ = 0;
  };
  // Replaces encoded gradients by their float32 rows (codec.h), before anything else looks
  // at them; INVALID_ARGUMENT naming `where` and the key when a row is no valid encoding,
  // RESOURCE_EXHAUSTED (nothing allocated) when `budget` cannot take the decoded rows.
  grpc::Status decode_grads(Encoding enc, const std::vector<Part>& parts, const std::string& keys,
                            std::string* grads, const std::string& where,
                            DecodeBudget* budget) const;
  // What a pull's reply carries beside its rows (PullRequest's session, row_steps and
  // row_states): the session's position, read before the rows are gathered.
  struct PullExtras {
    uint64_t session_id = 0;
    std::optional<CommitSessions::Position> session;
    bool steps = false;
    bool states = false;
  };
  // A pull's reply: the rows of every part's keys encoded as `enc` (part after part, each at
  // its table's dim), then the fields `extras` asks for (row_states: each part's
  // state_floats() per row).
  grpc::Status write_rows(const int64_t* keys, const std::vector<Part>& parts, Encoding enc,
                          const PullExtras& extras, BB* resp) const;
  // lr finite and > 0 (`who` names the table in errors).
  static grpc::Status check_lr(float lr, const std::string& who);
  // Every gradient value finite; otherwise INVALID_ARGUMENT naming `where`, the table and the
  // key.
  grpc::Status check_finite(const std::vector<Part>& parts, const std::string& keys,
                            const std::string& grads, const std::string& where) const;

  const ServerOptions opts_;
  std::function<void()> on_shutdown_;
  std::unique_ptr<TestHooks> hooks_;  // before tables_, which point at it
  ShardTables tables_;
  CommitSessions sessions_;
  mutable Counters counters_;
  mutable std::atomic<uint64_t> decoding_bytes_{0};  // DecodeBudget
  std::mutex load_mu_;
  std::unique_ptr<ckpt::LoadedRows> prepared_;  // a PREPAREd load waiting for COMMIT
};

}  // namespace cpu_dist::ps
