// The gRPC face of a shard, behind its token gate (token_gate.h: a call without the right
// token is refused before its request is received, whatever the method).
//
// Pull, Push and Commit, the calls a client makes on every step, are raw unary callback
// methods (PsUnaryMethods): gRPC hands over the request with the call, and the reply and status
// leave in one batch that finishes on the thread that served it.  Every other method is served by
// one generic callback service (PsCallService), whose reactors read the request, run the
// method where it may block, and park the long polls.  A generic (bidi) reactor's OnDone
// always goes through gRPC's executor thread, one more thread wake-up per call: that cost a
// 256-key Pull about 15 % of its rows/s (gRPC 1.51), which is why the step's calls are not
// served by the generic service.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/service_type.h"
#include "service.h"

namespace cpu_dist::ps {

// Threads of the shard's own that run the calls that may block, so that gRPC's callback
// threads never wait on a lock: with `threads` 1, long work (Save, Load) in order; with more,
// the calls that may wait on the table's update lock or on a session applying a step (Commit,
// Push, CloseSession, AbortSessions, Dump, the start of a WaitCommitted).  A blocked call then
// holds one of these threads, never a callback thread, and the rest queue here (memory: their
// requests, bounded by the server's memory quota).  The destructor runs what is queued, then
// joins.
class BlockingWorker {
 public:
  explicit BlockingWorker(size_t threads = 1);
  ~BlockingWorker();
  BlockingWorker(const BlockingWorker&) = delete;
  BlockingWorker& operator=(const BlockingWorker&) = delete;
  void post(std::function<void()> task);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Threads for the calls that may block (not Save and Load): one per core, so that decoding
// and checking chunks uses the cores gRPC's threads did, and at least four, so that a few
// calls waiting on a frozen table leave others (a close, a long poll's start) served.
inline size_t update_threads() { return std::max<size_t>(4, std::thread::hardware_concurrency()); }

// Pull, Push and Commit as raw unary callback methods (see the top of this file).  Registered
// beside the generic service, which then serves every other method.
class PsUnaryMethods final : public grpc::Service {
 public:
  // `retry`: where a Push or Commit runs again when it could not finish on gRPC's thread
  // without waiting.
  PsUnaryMethods(PsService& service, BlockingWorker& retry);

 private:
  grpc::ServerUnaryReactor* serve(grpc::CallbackServerContext* ctx, Method method,
                                  const grpc::ByteBuffer* req, grpc::ByteBuffer* resp);

  PsService& service_;
  BlockingWorker& retry_;
};

class PsCallService final : public grpc::CallbackGenericService {
 public:
  explicit PsCallService(PsService& service) : service_(service) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;
  // Register with the server beside this service (ServerBuilder::RegisterService).
  grpc::Service* unary_methods() { return &unary_; }

 private:
  // Where a method runs: null on gRPC's callback thread (it cannot block), else a worker.
  BlockingWorker* worker_for(Method m);

  PsService& service_;
  BlockingWorker updates_{update_threads()};  // before worker_: Save/Load never wait on it
  BlockingWorker worker_;                     // Save and Load, in order
  PsUnaryMethods unary_{service_, updates_};
};

}  // namespace cpu_dist::ps
