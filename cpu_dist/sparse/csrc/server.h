// Lifecycle of one shard process's gRPC server: start on host:port (0 = OS picks), serve,
// and stop by draining in-flight calls -- on stop() or on the Shutdown RPC, whose handler
// must answer first and so hands the drain to a thread of its own.  The server's memory is
// bounded by a gRPC resource quota and each connection's concurrent streams by
// GRPC_ARG_MAX_CONCURRENT_STREAMS (ServerOptions).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "call_reactor.h"
#include "grpcpp/server.h"
#include "service.h"

namespace cpu_dist::ps {

class PsServer {
 public:
  explicit PsServer(ServerOptions opts);
  ~PsServer();
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  // Throws std::invalid_argument for options it cannot serve with (the message names them).
  // Binds and starts serving; returns the bound port.  Throws std::runtime_error.
  int start();
  // True once the server has stopped (waits up to timeout_s; < 0 waits forever).  Throws
  // std::runtime_error before start().
  bool wait(double timeout_s);
  // Drains in-flight calls (cancelling what is left after drain_timeout_s) and stops.
  void stop(double drain_timeout_s);

  StatsResponse stats() const { return service_->stats(); }
  TestHooks* test_hooks() { return service_->test_hooks(); }  // null unless options.test_hooks
  int port() const { return port_; }
  std::string address() const;
  const ServerOptions& options() const { return opts_; }

 private:
  void begin_stop(double drain_timeout_s);
  void sweep_loop();

  const ServerOptions opts_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<PsCallService> calls_;  // outlives server_ (declared after it is destroyed)
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread stopper_;  // runs the drain
  std::thread sweeper_;  // expires WaitCommitted long polls and idle sessions
  std::mutex join_mu_;
};

}  // namespace cpu_dist::ps
