#include "server.h"

#include <chrono>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "malloc_tuning.h"

namespace cpu_dist::ps {

namespace {
std::string host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}
}  // namespace

PsServer::PsServer(ServerOptions opts) : opts_(std::move(opts)) {
  if (opts_.dim == 0) throw std::invalid_argument("dim must be >= 1");
  if (opts_.token.empty()) throw std::invalid_argument("token must not be empty");
  if (opts_.num_shards == 0 || opts_.shard_index >= opts_.num_shards)
    throw std::invalid_argument(absl::StrCat("shard_index ", opts_.shard_index,
                                             " out of range for num_shards ", opts_.num_shards));
  service_ = std::make_unique<PsService>(opts_, [this] { begin_stop(10.0); });
}

PsServer::~PsServer() { stop(1.0); }

std::string PsServer::address() const { return host_port(opts_.host, port_); }

int PsServer::start() {
  tune_malloc_once();
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) throw std::runtime_error("server already started");
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string addr = host_port(opts_.host, opts_.port);
  builder.AddListeningPort(addr, grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(opts_.max_message_bytes);
  builder.SetMaxSendMessageSize(opts_.max_message_bytes);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    server_.reset();
    throw std::runtime_error(absl::StrCat("could not listen on ", addr));
  }
  port_ = bound;
  started_ = true;
  sweeper_ = std::thread([this] { sweep_loop(); });
  return port_;
}

void PsServer::sweep_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    const bool stopping = stopping_;
    lock.unlock();
    service_->sessions().expire_waiters(CommitSessions::Clock::now(), stopping);
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(stopping_ ? 5 : 20));
  }
}

void PsServer::begin_stop(double drain_timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_ || stopping_) return;
  stopping_ = true;
  cv_.notify_all();  // the sweeper now finishes every long poll
  stopper_ = std::thread([this, drain_timeout_s] {
    service_->sessions().expire_waiters(CommitSessions::Clock::now(), true);
    const auto deadline =
        std::chrono::system_clock::now() +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(drain_timeout_s > 0 ? drain_timeout_s : 0.0));
    server_->Shutdown(deadline);
    server_->Wait();
    std::lock_guard<std::mutex> l(mu_);
    stopped_ = true;
    cv_.notify_all();
  });
}

bool PsServer::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  // Nothing could ever stop a server that never started: waiting on it would hang.
  if (!started_) throw std::runtime_error("server not started: call start() before wait()");
  if (timeout_s < 0) {
    cv_.wait(lock, [this] { return stopped_; });
  } else {
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return stopped_; });
  }
  return stopped_;
}

void PsServer::stop(double drain_timeout_s) {
  begin_stop(drain_timeout_s);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!started_) return;
    cv_.wait(lock, [this] { return stopped_; });
  }
  std::lock_guard<std::mutex> join(join_mu_);
  if (stopper_.joinable()) stopper_.join();
  if (sweeper_.joinable()) sweeper_.join();
}

}  // namespace cpu_dist::ps
