// Client of a set of PS shards.  Keys go to shards by cpu_dist::shard_of; each shard gets
// `channels_per_shard` separate connections.  A pull deduplicates keys, splits them into
// RPCs (at most max_keys_per_rpc keys, and large per-shard requests over several channels),
// keeps all of them in flight on one completion queue, and decodes each reply straight
// into the caller's array.  Pushes and commits can run asynchronously behind an AsyncOp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "optimizer.h"
#include "ps.pb.h"
#include "table.h"

namespace cpu_dist::ps {

// A failed RPC: "shard I (ADDR): CODE: message".
class RpcError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A wait that ran out of time (WaitCommitted, Handle.wait).
class WaitTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ClientOptions {
  std::vector<std::string> addresses;
  std::string token;
  uint32_t dim = 0;
  std::string table = "embedding";
  uint32_t max_keys_per_rpc = 8192;
  uint32_t channels_per_shard = 2;
  double timeout_s = 60.0;
  int max_message_bytes = 64 << 20;
};

class AsyncOp;

// One outstanding unary RPC over the generic (raw bytes) stub.
struct Call {
  uint32_t shard = 0;
  uint32_t channel = 0;
  const char* method = nullptr;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  // Decodes a successful reply; a non-OK result marks the call failed (malformed reply).
  std::function<grpc::Status(Call&)> on_reply;
  AsyncOp* op = nullptr;
};
using Calls = std::vector<std::unique_ptr<Call>>;

// The state behind a Python Handle: done when every call finished.
class AsyncOp {
 public:
  explicit AsyncOp(Calls calls, std::function<std::string(const Call&)> describe);
  // True when done within timeout_s (< 0: forever).
  bool wait(double timeout_s);
  bool done();
  // Empty when every call succeeded, else the first failed call (in call order) described.
  std::string error();
  Calls& calls() { return calls_; }
  // Called by the completion thread; true when this was the last call.
  bool finish_call(Call* c);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Calls calls_;
  size_t remaining_;
  std::string error_;
  std::function<std::string(const Call&)> describe_;
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

  void pull(const int64_t* keys, size_t n, float* out);
  void push(const int64_t* keys, const float* grads, size_t n, float lr, OptimizerKind opt);
  std::shared_ptr<AsyncOp> push_async(const int64_t* keys, const float* grads, size_t n,
                                      float lr, OptimizerKind opt);
  void commit(uint64_t session, int64_t step, uint32_t rank, uint32_t world_size,
              const int64_t* keys, const float* grads, size_t n, float lr, OptimizerKind opt);
  std::shared_ptr<AsyncOp> commit_async(uint64_t session, int64_t step, uint32_t rank,
                                        uint32_t world_size, const int64_t* keys,
                                        const float* grads, size_t n, float lr,
                                        OptimizerKind opt);
  // Min committed step over shards once all reached `step`; WaitTimeout otherwise.
  int64_t wait_committed(uint64_t session, int64_t step, double timeout_s);
  int64_t committed_step(uint64_t session);
  void close_session(uint64_t session, uint32_t rank);
  std::vector<StatsResponse> stats();
  std::vector<HealthResponse> health();
  void shutdown();
  TableDump dump();  // merged over shards, sorted by key
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

  // Raises AsyncOp's error as RpcError (for Handle.wait).
  static void raise_if_failed(AsyncOp& op);

 private:
  struct Shard {
    std::string address;
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  };

  Call& add_call(Calls& calls, uint32_t shard, uint32_t channel, const char* method);
  // Runs calls to completion on a private completion queue; throws RpcError.
  void run(Calls& calls, double timeout_s);
  std::shared_ptr<AsyncOp> run_async(Calls calls);
  void async_loop();
  std::string describe(const Call& c) const;
  size_t parts_for(size_t m) const;
  uint32_t next_channel_base() { return rr_.fetch_add(1, std::memory_order_relaxed); }

  Calls build_push(const int64_t* keys, const float* grads, size_t n, float lr,
                   OptimizerKind opt);
  Calls build_commit(uint64_t session, int64_t step, uint32_t rank, uint32_t world_size,
                     const int64_t* keys, const float* grads, size_t n, float lr,
                     OptimizerKind opt);
  // One small typed call per shard (Stats, Health, WaitCommitted, ...).
  Calls one_per_shard(const char* method, const google::protobuf::MessageLite& req);

  const ClientOptions opts_;
  std::vector<Shard> shards_;
  std::atomic<uint32_t> rr_{0};

  grpc::CompletionQueue async_cq_;
  std::thread async_thread_;
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::unordered_map<AsyncOp*, std::shared_ptr<AsyncOp>> pending_;
  bool closed_ = false;  // under pending_mu_
  std::mutex close_mu_;  // serialises close()
};

}  // namespace cpu_dist::ps
