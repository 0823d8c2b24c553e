#include "call_reactor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <utility>

#include "method_paths.h"
#include "ps.pb.h"
#include "wire.h"

namespace cpu_dist::ps {

using grpc::Status;
using grpc::StatusCode;
using Reactor = grpc::ServerGenericBidiReactor;

namespace {

// A call refused before anything of its request was read.  gRPC's reactor protocol: the
// reactor is created with new and deletes itself in OnDone.
class Refusal final : public Reactor {
 public:
  explicit Refusal(Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A unary method of the generic service: read the one request, run the method (on gRPC's
// thread when it cannot block, else on a BlockingWorker), write the reply.
class UnaryCall final : public Reactor {
 public:
  // `worker`: where the method runs (null: here).
  UnaryCall(PsService& service, Method method, BlockingWorker* worker)
      : service_(service), method_(method), worker_(worker) {
    StartRead(&req_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the client sent no message (or gRPC refused it, e.g. over the size limit)
      finish(Status(StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    if (worker_ != nullptr) {
      worker_->post([this] { finish(service_.run(method_, req_, &resp_)); });
    } else {
      finish(service_.run(method_, req_, &resp_));
    }
  }
  void OnDone() override { delete this; }

 private:
  void finish(Status status) {
    service_.count(&req_, &resp_, status);
    if (status.ok()) {
      StartWriteAndFinish(&resp_, grpc::WriteOptions(), Status::OK);
    } else {
      Finish(std::move(status));
    }
  }

  PsService& service_;
  const Method method_;
  BlockingWorker* const worker_;
  grpc::ByteBuffer req_, resp_;
};

// A long poll: WaitCommitted, or PullCommitted (a pull parked until a commit).  Parked in
// CommitSessions' waiter list, finished by a commit, by the sweeper at its deadline, or when
// the client cancels.  Referenced by OnReadDone and by gRPC (until OnDone), so it outlives
// whichever ends last.
class WaitCall final : public Reactor {
 public:
  WaitCall(PsService& service, const grpc::GenericCallbackServerContext& ctx,
           BlockingWorker& worker, Method method)
      : service_(service), ctx_(ctx), worker_(worker), method_(method) {
    StartRead(&req_);
  }
  // Starting the wait reads the session's state under its mutex, which a step being applied
  // holds: off the callback thread.
  void OnReadDone(bool ok) override {
    worker_.post([this, ok] { start(ok); });
  }
  void OnCancel() override {
    cancelled_.store(true);
    const uint64_t id = id_.load();
    if (id != 0 && service_.sessions().cancel_wait(id))
      finish(Status(StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override { unref(); }

 private:
  void start(bool ok) {
    if (!ok) {
      finish(Status(StatusCode::INVALID_ARGUMENT, "no request message"));
    } else {
      uint64_t id = 0;
      Status st =
          method_ == Method::kPullCommitted
              ? service_.start_pull_committed(
                    req_, deadline(), &resp_, [this](const Status& s) { finish(s); }, &id)
              : service_.start_wait(
                    req_, deadline(), [this](int64_t c, const Status& s) { answer(c, s); }, &id);
      if (!st.ok()) {
        finish(std::move(st));
      } else if (id != 0) {
        id_.store(id);
        if (cancelled_.load() && service_.sessions().cancel_wait(id))
          finish(Status(StatusCode::CANCELLED, "cancelled"));
      }
    }
    unref();
  }
  // Answer a little before the caller's deadline so that it gets a reply, not
  // DEADLINE_EXCEEDED; calls without a deadline wait at most ten minutes.
  CommitSessions::Clock::time_point deadline() const {
    auto remaining = ctx_.deadline() - std::chrono::system_clock::now();
    if (remaining > std::chrono::minutes(10)) remaining = std::chrono::minutes(10);
    remaining -= std::min<decltype(remaining)>(remaining / 10, std::chrono::milliseconds(50));
    return CommitSessions::Clock::now() +
           std::chrono::duration_cast<CommitSessions::Clock::duration>(remaining);
  }
  void answer(int64_t committed, const Status& st) {
    if (!st.ok()) {  // the session ended or failed: the step will never commit
      finish(st);
      return;
    }
    WaitCommittedResponse r;
    r.set_committed_step(committed);
    wire::serialize(r, &resp_);
    finish(Status::OK);
  }
  void finish(Status status) {
    service_.count(&req_, &resp_, status);
    if (status.ok()) {
      StartWriteAndFinish(&resp_, grpc::WriteOptions(), Status::OK);
    } else {
      Finish(std::move(status));
    }
  }
  void unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  PsService& service_;
  const grpc::GenericCallbackServerContext& ctx_;
  BlockingWorker& worker_;
  const Method method_;
  grpc::ByteBuffer req_, resp_;
  std::atomic<uint64_t> id_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<int> refs_{2};
};

}  // namespace

Reactor* PsCallService::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  // The token was checked before the call got here (token_gate.h).
  const std::optional<Method> method = method_of(ctx->method());
  // gRPC's reactor protocol: every reactor below deletes itself in OnDone.
  if (!method) {
    Status st(StatusCode::UNIMPLEMENTED, "unknown method " + ctx->method().substr(0, 200));
    const grpc::ByteBuffer none;
    service_.count(&none, &none, st);
    return new Refusal(std::move(st));
  }
  if (*method == Method::kWaitCommitted || *method == Method::kPullCommitted)
    return new WaitCall(service_, *ctx, updates_, *method);
  return new UnaryCall(service_, *method, worker_for(*method));
}

BlockingWorker* PsCallService::worker_for(Method m) {
  switch (m) {
    case Method::kSave:
    case Method::kLoad: return &worker_;
    // A session's mutex (held while its step applies), or a whole pass over the index.
    case Method::kCloseSession:
    case Method::kAbortSessions:
    case Method::kDump:
    case Method::kCreateTables:  // the tables' lock; an SSD tier opens a database
    case Method::kWaitCommitted:
    case Method::kPullCommitted: return &updates_;
    // Served by PsUnaryMethods (registered, so never routed here).
    case Method::kPull:
    case Method::kPush:
    case Method::kCommit: return nullptr;
    // Stripe locks for a moment at most.
    case Method::kStats:
    case Method::kHealth:
    case Method::kShutdown: return nullptr;
  }
  return &updates_;
}

// ---- PsUnaryMethods ---------------------------------------------------------------------

PsUnaryMethods::PsUnaryMethods(PsService& service, BlockingWorker& retry)
    : service_(service), retry_(retry) {
  using Handler = grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
  const std::pair<const char*, Method> methods[] = {{paths::kPull, Method::kPull},
                                                    {paths::kPush, Method::kPush},
                                                    {paths::kCommit, Method::kCommit}};
  int index = 0;
  for (const auto& [path, method] : methods) {
    // grpc::Service owns what it is given (its handlers and methods are unique_ptrs inside).
    AddMethod(std::make_unique<grpc::internal::RpcServiceMethod>(
                  path, grpc::internal::RpcMethod::NORMAL_RPC, nullptr)
                  .release());
    MarkMethodRawCallback(
        index++, std::make_unique<Handler>([this, m = method](grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* req,
                                                              grpc::ByteBuffer* resp) {
                   return serve(ctx, m, req, resp);
                 }).release());
  }
}

grpc::ServerUnaryReactor* PsUnaryMethods::serve(grpc::CallbackServerContext* ctx, Method method,
                                                const grpc::ByteBuffer* req,
                                                grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();  // the token gate passed it
  bool deferred = false;
  // Pull waits on no lock but a stripe's for a moment; Push and Commit are tried here without
  // waiting, and where one would have to (the update lock, a session's mutex) it runs again
  // from its request on a thread that may wait (a commit chunk stored already is then an
  // identical retry, which applies its complete step).
  const bool may_defer = method == Method::kPush || method == Method::kCommit;
  Status st = service_.run(method, *req, resp, may_defer ? &deferred : nullptr);
  if (deferred) {
    retry_.post([this, method, req, resp, reactor] {
      if (TestHooks* hooks = service_.test_hooks()) hooks->reach(TestPoint::kDeferredRetry);
      Status s = service_.run(method, *req, resp);
      service_.count(req, resp, s);
      reactor->Finish(std::move(s));
    });
    return reactor;
  }
  service_.count(req, resp, st);
  reactor->Finish(std::move(st));
  return reactor;
}

// ---- BlockingWorker ---------------------------------------------------------------------

BlockingWorker::BlockingWorker(size_t threads) {
  threads_.reserve(std::max<size_t>(1, threads));
  for (size_t i = 0; i < std::max<size_t>(1, threads); ++i)
    threads_.emplace_back([this] { loop(); });
}

BlockingWorker::~BlockingWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void BlockingWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void BlockingWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace cpu_dist::ps
