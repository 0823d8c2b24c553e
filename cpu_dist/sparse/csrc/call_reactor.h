// The gRPC face of a shard: one generic callback service for every method.  Each call's
// reactor checks the token in the call's metadata first and only then starts reading the
// request, so a call without the right token is refused (UNAUTHENTICATED) before its body is
// received or parsed: an unread message stays in HTTP/2 flow control (a window of at most
// what the transport allows before the application reads), and the server never buffers or
// parses it.  gRPC 1.51's typed and raw callback methods, by contrast, deliver the whole
// request message before the handler runs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "grpcpp/generic/async_generic_service.h"
#include "service.h"

namespace cpu_dist::ps {

// One thread that runs long blocking work (Save, Load) in order, so that gRPC's own threads
// keep serving pulls meanwhile.  The destructor runs what is queued, then joins.
class BlockingWorker {
 public:
  BlockingWorker();
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
  std::thread thread_;
};

class PsCallService final : public grpc::CallbackGenericService {
 public:
  explicit PsCallService(PsService& service) : service_(service) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  PsService& service_;
  BlockingWorker worker_;
};

}  // namespace cpu_dist::ps
