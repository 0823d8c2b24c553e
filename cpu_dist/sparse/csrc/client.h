// Client of a set of PS shards.  Keys go to shards by cpu_dist::shard_of; each shard gets
// `channels_per_shard` separate connections.  A pull deduplicates keys, splits them into
// RPCs (ShardSplit: at most max_keys_per_rpc keys, and large per-shard requests over several
// channels), keeps all of them in flight at once, and decodes each reply straight into the
// output rows.  Every update (push, commit) and pull_async runs asynchronously behind an
// AsyncOp; the blocking push and commit are the asynchronous ones followed by a wait.
// Rows cross the wire encoded as the call's Encoding says (codec.h): pulls take the client's
// `compression` unless the call names another, pushes and commits always take the client's;
// dumps and checkpoints are never compressed.
// Many tables: a client names the (table, dim) of every table it moves (ClientOptions::tables).
// pull_tables/push_tables/commit_tables carry several tables in one request (proto TablePart):
// each table's keys go to shards by its salted shard_of, and per shard the tables' keys are
// laid end to end and cut into RPCs of at most max_keys_per_rpc keys (MultiSplit), so a step
// costs one RPC per shard per max_keys_per_rpc keys whatever the number of tables.
// Every call carries the token as call metadata.  Pulls and commit chunks (idempotent: the
// shard deduplicates chunks) are sent again after UNAVAILABLE, at most kMaxRetries times with
// exponential back-off, within the call's own deadline; pushes never are.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "codec.h"
#include "dump_page.h"
#include "grpcpp/channel.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "optimizer.h"
#include "ps.pb.h"
#include "rpc_call.h"
#include "shard_split.h"

namespace cpu_dist::ps {

// A table the client moves: its name (the shard's) and row width.
struct ClientTable {
  std::string name;
  uint32_t dim = 0;
};

// The one definition of the client's defaults: the Python binding builds its keyword
// defaults (and _ps.client_defaults()) from a default-constructed ClientOptions.
struct ClientOptions {
  std::vector<std::string> addresses;
  std::string token;
  // The one-table calls' table (pull, push, commit, dump, save, load): with `tables`, one of
  // them (`table` where it names one, else the first) and `dim` 0 or its dim.
  uint32_t dim = 0;
  std::string table = "embedding";
  // Every table of the multi-table calls, in the order their parts cross the wire; empty:
  // the one table (table, dim).
  std::vector<ClientTable> tables;
  uint32_t max_keys_per_rpc = 8192;
  uint32_t channels_per_shard = 2;
  double timeout_s = 60.0;
  int max_message_bytes = 64 << 20;
  // The job's encoding of pulled rows and of pushed and committed gradients.  The key limit
  // per RPC stays that of float32 rows, so a float32 pull of the same keys always fits.
  Encoding compression = Encoding::kNone;
};

// Per-pull choices: the reply's encoding (nullopt: the client's compression), and a commit
// session whose committed step each shard reports with its rows.
struct PullOptions {
  std::optional<Encoding> compression;
  std::optional<uint64_t> session;
  // With session, pull_async only: per row, the session step up to which the row holds every
  // commit (PullReport::steps), and its optimizer state (PullReport::states).
  bool row_steps = false;
  bool row_states = false;
  // With session: PullCommitted, every shard (one without keys too) answering once step
  // `after_step` of the session is committed on it, so that its reply's committed step says
  // so; the calls then wait up to wait_timeout_s (> 0) instead of the client's timeout_s.
  std::optional<int64_t> after_step;
  double wait_timeout_s = 0.0;
};

// Gradient rows of a push or commit: keys[n], grads[n][dim].  Read before the call returns.
struct Gradients {
  const int64_t* keys = nullptr;
  const float* grads = nullptr;
  size_t n = 0;
  float lr = 0.0f;
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

// One table's share of a multi-table pull: keys[n] of client table `table` (an index into
// PsClient::tables()).  Read before the call returns.
struct TableKeysIn {
  uint32_t table = 0;
  const int64_t* keys = nullptr;
  size_t n = 0;
};

// One table's share of a multi-table push or commit: keys[n], grads[n][that table's dim],
// and its learning rate.  Read before the call returns.
struct TableGradients {
  uint32_t table = 0;
  const int64_t* keys = nullptr;
  const float* grads = nullptr;
  size_t n = 0;
  float lr = 0.0f;
};

// Where a commit belongs: rank `rank` of `world_size`, step `step` of session `session`; a
// shard accepts it up to max_ahead steps beyond its committed one (1: the next step only).
struct CommitPoint {
  uint64_t session = 0;
  int64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t max_ahead = 1;
  int64_t base_step = 0;  // the job step of the session's step 0 (step rules; table_rules.h)
};

// What a refused commit's error names, in the client and its binding alike: "commit of
// session S step T rank R".
inline std::string commit_where(const CommitPoint& at) {
  return "commit of session " + std::to_string(at.session) + " step " + std::to_string(at.step) +
         " rank " + std::to_string(at.rank);
}

// Retries of idempotent calls: at most kMaxRetries, the first after kFirstBackoff, each
// next one after twice the previous wait (50, 100, 200 ms).
inline constexpr uint32_t kMaxRetries = 3;
inline constexpr std::chrono::milliseconds kFirstBackoff{50};

class PsClient;

// Pages of every shard's rows (Client.dump_pages): fetches the next page of every shard not
// yet done in parallel, and holds at most one page per shard.
class DumpPager {
 public:
  // The pages of table `table` (an index into PsClient::tables()).
  DumpPager(PsClient& client, uint64_t max_bytes, uint32_t table);
  // The next non-empty page (keys sorted inside it); false when every shard is done.
  bool next(DumpRows* page);

 private:
  struct Shard {
    PageCursor cursor;
    bool done = false;
  };
  PsClient& client_;
  const uint64_t max_bytes_;
  const uint32_t table_;
  std::vector<Shard> shards_;
  std::vector<DumpRows> ready_;  // fetched pages not handed out yet, at most one per shard
};

class PsClient {
 public:
  explicit PsClient(ClientOptions opts);
  ~PsClient();  // close()
  // Waits for in-flight async operations (they end by their deadlines at the latest) and
  // stops the completion thread.  Idempotent; later calls throw std::runtime_error.
  void close();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  uint32_t num_shards() const { return static_cast<uint32_t>(shards_.size()); }
  const std::vector<std::string>& addresses() const { return opts_.addresses; }
  uint32_t dim() const { return opts_.dim; }
  const std::string& table() const { return opts_.table; }
  // Every table of the multi-table calls, in wire order (the one table without
  // ClientOptions::tables); table_index: the position of `name` there.
  const std::vector<ClientTable>& tables() const { return opts_.tables; }
  std::optional<uint32_t> table_index(const std::string& name) const;
  double timeout_s() const { return opts_.timeout_s; }
  TrafficCounts traffic() const { return traffic_.snapshot(); }

  Encoding compression() const { return opts_.compression; }

  // Rows of keys[n] into out[n][dim]; blocking.
  void pull(const int64_t* keys, size_t n, float* out, const PullOptions& po = {});
  // The same into rows the op owns (AsyncOp::take_output once done): nothing is written
  // into the caller's memory after this returns.  AsyncOp::committed_seen() gives what the
  // shards reported for po.session.
  std::shared_ptr<AsyncOp> pull_async(const int64_t* keys, size_t n, const PullOptions& po = {});
  // Of the last blocking pull that finished and named a session (on any thread): the
  // minimum committed step the shards it touched reported; nullopt before one, or when it
  // touched no shard.  Concurrent pullers use pull_async and committed_seen() instead.
  std::optional<int64_t> last_pull_committed() const;
  // Direct updates (benchmarks, tests, bulk loading); training uses commit.
  std::shared_ptr<AsyncOp> push_async(const Gradients& g);
  void push(const Gradients& g);
  std::shared_ptr<AsyncOp> commit_async(const CommitPoint& at, const Gradients& g);
  void commit(const CommitPoint& at, const Gradients& g);

  // Many tables in one call (proto TablePart), `parts` in any order (sent in table order;
  // each table at most once).  pull_tables_async: the op's outputs and reports are per part
  // in table order (in_table_order gives it); with row_states each table's states are
  // state_width floats per row (the table's optimizer, asked of the shards once).
  std::shared_ptr<AsyncOp> pull_tables_async(const std::vector<TableKeysIn>& parts,
                                             const PullOptions& po = {});
  // `optimizer`: the requests' optimizer field (nullopt: unset, each table runs its spec's;
  // a table the shard's flags declared runs the one named, as a one-table update does).
  std::shared_ptr<AsyncOp> push_tables_async(const std::vector<TableGradients>& parts,
                                             std::optional<OptimizerKind> optimizer = {});
  // Every chunk of the step names every table of `parts`, those without keys too (count 0),
  // and every shard gets at least one chunk (the empty marker): the step covers them all.
  std::shared_ptr<AsyncOp> commit_tables_async(const CommitPoint& at,
                                               const std::vector<TableGradients>& parts,
                                               std::optional<OptimizerKind> optimizer = {});
  // `parts` in the wire order of the multi-table calls (by table), checked: known tables,
  // each at most once (std::invalid_argument naming the table otherwise).
  template <class P>
  std::vector<P> in_table_order(std::vector<P> parts) const;
  // Optimizer state floats per row of client table `table`: 1 (sgd, row-wise Adagrad) or its
  // dim (Adagrad), from the specs create_tables sent or, once, the shards' Health.
  uint32_t state_width(uint32_t table);
  // Creates `specs` on every shard (idempotent for identical specs); one reply per shard.
  std::vector<CreateTablesResponse> create_tables(const std::vector<TableSpec>& specs);

  // Min committed step over shards once all reached `step`; WaitTimeout otherwise.
  int64_t wait_committed(uint64_t session, int64_t step, double timeout_s);
  int64_t committed_step(uint64_t session);
  void close_session(uint64_t session, uint32_t rank);
  // Ends every open commit session on every shard (a job takes the shards over).
  std::vector<AbortSessionsResponse> abort_sessions();
  std::vector<StatsResponse> stats();
  std::vector<HealthResponse> health();
  void shutdown();
  // Every row of every shard, sorted by key, fetched in pages of at most max_bytes (0: the
  // default page) from all shards in parallel; no size limit.
  // `table`: an index into tables() (the one-table calls' table by default).
  DumpRows dump(uint64_t max_bytes = 0, std::optional<uint32_t> table = std::nullopt);
  std::unique_ptr<DumpPager> dump_pages(uint64_t max_bytes,
                                        std::optional<uint32_t> table = std::nullopt);
  // Checkpoints (paths relative to each shard's checkpoint directory).  save: shard i writes
  // paths[i]; with check_session it refuses unless the session is exactly at session_step.
  std::vector<SaveResponse> save(const std::vector<std::string>& paths, int64_t step,
                                 bool check_session, uint64_t session, int64_t session_step,
                                 double timeout_s);
  // load: every shard loads the rows it owns from all of `paths` (one checkpoint's files);
  // with several shards in two stages (PREPARE everywhere, then COMMIT), all or nothing.
  std::vector<LoadResponse> load(const std::vector<std::string>& paths,
                                 const std::vector<uint64_t>& sizes,
                                 const std::vector<uint32_t>& checksums, double timeout_s);

 private:
  friend class DumpPager;
  struct Shard {
    std::string address;
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  };
  // A pull's calls, what completes it once every call succeeded (rows of repeated keys),
  // where its replies report their committed steps (null: no session named), and the
  // calls' deadline (route_pull's).
  struct PullPlan {
    Calls calls;
    std::function<void()> finish;
    std::shared_ptr<PullReport> seen;
    double timeout_s = 0.0;
  };
  // Called with the calls of call_every_shard when any failed; must throw.
  using FailureHandler = std::function<void(const Calls&)>;

  // ---- call plumbing (client.cc) ----
  Call& add_call(Calls& calls, uint32_t shard, uint32_t channel, const char* method);
  // A call of one part; its traffic is the part's keys and rows encoded as `enc`.
  Call& add_part_call(Calls& calls, const Part& part, const char* method, TrafficKind kind,
                      Encoding enc);
  void start_call(Call& c, grpc::CompletionQueue* cq,
                  std::chrono::system_clock::time_point deadline);
  // Decodes a finished call's reply and counts its traffic: the one place both happen.
  void settle(Call& c);
  // A completion of `c` that is not its end: an alarm after which it is sent again, or an
  // UNAVAILABLE attempt that is retried (after an alarm).  False: the call is finished.
  bool advance(Call& c, grpc::CompletionQueue* cq);
  // Runs calls to completion on the caller's thread (a private completion queue).
  void run_calls(Calls& calls, double timeout_s);
  void throw_first_failure(const Calls& calls) const;  // RpcError, if any call failed
  void run(Calls& calls, double timeout_s);            // run_calls, then throw_first_failure
  // Starts calls on the shared completion thread; the op tracks them.
  // `timeout_s`: the calls' deadline (nullopt: the client's timeout_s).
  std::shared_ptr<AsyncOp> run_async(Calls calls, std::function<void()> on_success = {},
                                     std::vector<RowBuffer> outputs = {},
                                     std::vector<std::shared_ptr<const PullReport>> seen = {},
                                     std::optional<double> timeout_s = std::nullopt);
  void async_loop();
  RpcError describe(const Call& c) const;  // "shard I (ADDR): CODE: message" and its fields
  SplitLimits limits() const;
  uint32_t next_channel_base() { return rr_.fetch_add(1, std::memory_order_relaxed); }
  PullPlan plan_pull(const int64_t* keys, size_t n, float* out, const PullOptions& po);
  // A pull's method, split rule and deadline: Pull, or PullCommitted (checked: it needs a
  // session and a wait timeout) reaching every shard.
  struct PullRoute {
    const char* method;
    SplitRule rule;
    double timeout_s;
  };
  PullRoute route_pull(const PullOptions& po) const;

  // ---- administration (client_admin.cc) ----
  // One typed call per shard, make_request(s) being shard s's request; the replies in shard
  // order.  On failure: on_failure(calls) if given, else RpcError for the first failed call.
  template <class Reply, class MakeRequest>
  std::vector<Reply> call_every_shard(const char* method, const MakeRequest& make_request,
                                      double timeout_s, const FailureHandler& on_failure = {});
  // The same for the listed shards only; replies in that order.
  template <class Reply, class MakeRequest>
  std::vector<Reply> call_shards(const char* method, const std::vector<uint32_t>& shards,
                                 const MakeRequest& make_request, double timeout_s,
                                 const FailureHandler& on_failure = {});
  // The next page of each listed shard from its cursor (pages of at most max_bytes, 0: the
  // default); each reply checked for its sizes and an advancing cursor.
  std::vector<DumpResponse> dump_round(const std::vector<uint32_t>& shards,
                                       const std::vector<PageCursor>& from, uint64_t max_bytes,
                                       uint32_t table);

  const ClientOptions opts_;
  std::vector<Shard> shards_;
  std::atomic<uint32_t> rr_{0};
  Traffic traffic_;
  mutable std::mutex last_pull_mu_;
  std::optional<int64_t> last_pull_committed_;  // under last_pull_mu_
  std::mutex widths_mu_;
  std::unordered_map<std::string, uint32_t> state_widths_;  // by table name, under widths_mu_

  grpc::CompletionQueue async_cq_;
  std::thread async_thread_;
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::unordered_map<AsyncOp*, std::shared_ptr<AsyncOp>> pending_;
  bool closed_ = false;  // under pending_mu_
  std::mutex close_mu_;  // serialises close()
};

template <class P>
std::vector<P> PsClient::in_table_order(std::vector<P> parts) const {
  std::sort(parts.begin(), parts.end(), [](const P& a, const P& b) { return a.table < b.table; });
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].table >= opts_.tables.size())
      throw std::invalid_argument("table index " + std::to_string(parts[i].table) +
                                  " out of range: the client has " +
                                  std::to_string(opts_.tables.size()) + " tables");
    if (i > 0 && parts[i].table == parts[i - 1].table)
      throw std::invalid_argument("table '" + opts_.tables[parts[i].table].name +
                                  "' named twice in one call");
  }
  return parts;
}

}  // namespace cpu_dist::ps
