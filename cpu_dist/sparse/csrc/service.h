// The gRPC service of one shard: request validation, the table, commit sessions, counters.
// Every method is a raw (ByteBuffer) callback method so that the service, not gRPC, decides
// what a malformed request gets (a precise INVALID_ARGUMENT), and so that Pull's reply can be
// written by hand straight from the table without a protobuf copy of the payload.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "checkpoint.h"
#include "commit.h"
#include "ps.grpc.pb.h"
#include "table.h"

namespace cpu_dist::ps {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  uint32_t dim = 0;
  std::string token;
  std::string table = "embedding";
  uint64_t seed = 0;
  float init_scale = 0.0f;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int max_message_bytes = 64 << 20;
  uint32_t stripes = 16;
  uint32_t max_blocks_per_stripe = 65536;  // capacity cap (table.h); at most 65536
  // Save/Load read and write files under this directory only; empty: both are refused.
  std::string checkpoint_dir;
};

struct Counters {
  std::atomic<uint64_t> pull_calls{0}, pull_keys{0}, push_calls{0}, push_keys{0}, commit_calls{0},
      commit_keys{0}, errors{0}, bytes_in{0}, bytes_out{0};
};

// Base with the raw callback methods: Raw<Base, A, B>::type is A<B<Base>>.
template <class Base, template <class> class... Methods>
struct Raw {
  using type = Base;
};
template <class Base, template <class> class First, template <class> class... Rest>
struct Raw<Base, First, Rest...> {
  using type = First<typename Raw<Base, Rest...>::type>;
};

// Every method raw (ByteBuffer in and out): see the comment at the top.
using PsServiceBase = Raw<
    ParameterServer::Service, ParameterServer::WithRawCallbackMethod_Pull,
    ParameterServer::WithRawCallbackMethod_Push, ParameterServer::WithRawCallbackMethod_Commit,
    ParameterServer::WithRawCallbackMethod_WaitCommitted,
    ParameterServer::WithRawCallbackMethod_CloseSession,
    ParameterServer::WithRawCallbackMethod_Stats, ParameterServer::WithRawCallbackMethod_Health,
    ParameterServer::WithRawCallbackMethod_Dump, ParameterServer::WithRawCallbackMethod_Shutdown,
    ParameterServer::WithRawCallbackMethod_Save, ParameterServer::WithRawCallbackMethod_Load>::type;

class PsService final : public PsServiceBase {
 public:
  // `on_shutdown` is called (once per Shutdown RPC, after validation) from a gRPC thread;
  // it must not block on the server draining.
  PsService(const ServerOptions& opts, std::function<void()> on_shutdown);

  StatsResponse stats() const;
  CommitSessions& sessions() { return sessions_; }

  using R = grpc::ServerUnaryReactor;
  using Ctx = grpc::CallbackServerContext;
  using BB = grpc::ByteBuffer;
  R* Pull(Ctx* ctx, const BB* req, BB* resp) override;
  R* Push(Ctx* ctx, const BB* req, BB* resp) override;
  R* Commit(Ctx* ctx, const BB* req, BB* resp) override;
  R* WaitCommitted(Ctx* ctx, const BB* req, BB* resp) override;
  R* CloseSession(Ctx* ctx, const BB* req, BB* resp) override;
  R* Stats(Ctx* ctx, const BB* req, BB* resp) override;
  R* Health(Ctx* ctx, const BB* req, BB* resp) override;
  R* Dump(Ctx* ctx, const BB* req, BB* resp) override;
  R* Shutdown(Ctx* ctx, const BB* req, BB* resp) override;
  R* Save(Ctx* ctx, const BB* req, BB* resp) override;
  R* Load(Ctx* ctx, const BB* req, BB* resp) override;

 private:
  // The bodies of the handlers, each run by handle() after the shared preamble.
  grpc::Status do_pull(PullRequest& r, BB* resp);
  grpc::Status do_push(PushRequest& r, BB* resp);
  grpc::Status do_commit(CommitRequest& r, BB* resp);
  grpc::Status do_close(CloseSessionRequest& r, BB* resp);
  grpc::Status do_stats(StatsRequest& r, BB* resp);
  grpc::Status do_health(HealthRequest& r, BB* resp);
  grpc::Status do_dump(DumpRequest& r, BB* resp);
  grpc::Status do_shutdown(ShutdownRequest& r, BB* resp);
  grpc::Status do_save(SaveRequest& r, BB* resp);
  grpc::Status do_load(LoadRequest& r, BB* resp);
  grpc::Status load_files(LoadRequest& r, BB* resp);    // stages LOAD, PREPARE
  grpc::Status finish_load(LoadStage stage, BB* resp);  // stages COMMIT, ABORT
  // `rel` inside the checkpoint directory (no absolute path, no "..") -> full path.
  grpc::Status checkpoint_path(const std::string& rel, std::string* full) const;

  // The preamble every method shares: parse the request, check the token, and the table
  // and the dim where the message has them.
  template <class Req>
  grpc::Status admit(const BB& req, Req* r) const;
  // A whole unary method: admit, run `body`, finish.
  template <class Req>
  R* handle(Ctx* ctx, const BB* req, BB* resp, grpc::Status (PsService::*body)(Req&, BB*));
  // Finishes a call with `status`, counting errors and bytes.
  R* finish(Ctx* ctx, const BB* req, const BB* resp, grpc::Status status);

  grpc::Status check_token(const std::string& token) const;
  grpc::Status check_table(const std::string& table) const;
  grpc::Status check_dim(uint32_t dim) const;
  grpc::Status check_rows(const std::string& keys, const std::string* grads, size_t* n) const;
  grpc::Status check_update(float lr, int optimizer, OptimizerKind* kind) const;

  const ServerOptions opts_;
  std::function<void()> on_shutdown_;
  ShardTable table_;
  CommitSessions sessions_;
  mutable Counters counters_;
  std::mutex load_mu_;
  std::unique_ptr<ckpt::LoadedRows> prepared_;  // a PREPAREd load waiting for COMMIT
};

}  // namespace cpu_dist::ps
