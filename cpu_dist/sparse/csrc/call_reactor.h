// The gRPC face of a shard: one generic callback service for every method.  Each call's
// reactor checks the token in the call's metadata first and only then starts reading the
// request, so a call without the right token is refused (UNAUTHENTICATED) before its body is
// received or parsed: an unread message stays in HTTP/2 flow control (a window of at most
// what the transport allows before the application reads), and the server never buffers or
// parses it.  gRPC 1.51's typed and raw callback methods, by contrast, deliver the whole
// request message before the handler runs.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "grpcpp/generic/async_generic_service.h"
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

class PsCallService final : public grpc::CallbackGenericService {
 public:
  explicit PsCallService(PsService& service) : service_(service) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  // Where a method runs: null on gRPC's callback thread (it cannot block), else a worker.
  BlockingWorker* worker_for(Method m);

  PsService& service_;
  BlockingWorker updates_{update_threads()};  // before worker_: Save/Load never wait on it
  BlockingWorker worker_;                     // Save and Load, in order
};

}  // namespace cpu_dist::ps
