#include "server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "process_tuning.h"
#include "token_gate.h"

namespace cpu_dist::ps {

namespace {
std::string host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// Why host:port cannot be bound, asked of the OS after gRPC failed to listen (gRPC says only
// that it failed): strerror of the bind, or empty when a bind now works.
std::string bind_error(const std::string& host, int port) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          ::getaddrinfo(h.empty() ? nullptr : h.c_str(), service.c_str(), &hints, &found);
      rc != 0)
    return absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  std::string why;
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;  // as gRPC binds: a port in TIME_WAIT only is not "in use"
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    const int err = errno;
    ::close(fd);
    if (bound) return {};
    if (why.empty())
      why = err == EADDRINUSE ? std::string("address already in use") : std::strerror(err);
  }
  return why;
}

void check_options(const ServerOptions& o) {
  using std::invalid_argument;
  if (o.dim > 0 && !o.tables.empty())
    throw invalid_argument(absl::StrCat("dim ", o.dim, " declares the one table '", o.table,
                                        "' by flags, and ", o.tables.size(),
                                        " tables are given as specs: give one or the other"));
  for (const ShardTableSpec& spec : o.tables)
    if (const std::string why = spec_error(spec); !why.empty()) throw invalid_argument(why);
  const size_t num_tables = o.tables.empty() ? (o.dim > 0 ? 1 : 0) : o.tables.size();
  if (const std::string why =
          budget_refusal(o.memory_rows, o.memory_bytes, !o.ssd_dir.empty(), num_tables);
      !why.empty())
    throw invalid_argument(why);
  check_token_text(o.token);
  if (o.num_shards == 0 || o.shard_index >= o.num_shards)
    throw invalid_argument(
        absl::StrCat("shard_index ", o.shard_index, " out of range for num_shards ", o.num_shards));
  if (o.max_message_bytes < 4096)
    throw invalid_argument(
        absl::StrCat("max_message_bytes must be >= 4096, got ", o.max_message_bytes));
  if (!std::isfinite(o.session_idle_timeout_s) || o.session_idle_timeout_s < 0)
    throw invalid_argument(absl::StrCat("session_idle_timeout_s must be >= 0 (0: never), got ",
                                        o.session_idle_timeout_s));
  if (o.max_sessions == 0) throw invalid_argument("max_sessions must be >= 1");
  if (o.max_concurrent_streams == 0) throw invalid_argument("max_concurrent_streams must be >= 1");
  if (!o.ssd_dir.empty() && o.memory_rows == 0 && o.memory_bytes == 0)
    throw invalid_argument(absl::StrCat("ssd_dir '", o.ssd_dir,
                                        "' needs memory_rows >= 1 (--ps-memory-rows) or "
                                        "memory_bytes (--ps-memory-bytes): the SSD tier holds the "
                                        "rows beyond the DRAM budget"));
  if (!o.ssd_dir.empty() && o.ssd_dir.front() != '/')
    throw invalid_argument(absl::StrCat("ssd_dir must be an absolute path, got '", o.ssd_dir, "'"));
  const uint64_t min_memory = 4 * static_cast<uint64_t>(o.max_message_bytes);
  if (o.max_memory_bytes < min_memory)
    throw invalid_argument(absl::StrCat("max_memory_bytes ", o.max_memory_bytes,
                                        " must be at least 4 x max_message_bytes (", min_memory,
                                        ")"));
}
}  // namespace

PsServer::PsServer(ServerOptions opts) : opts_(std::move(opts)) {
  check_options(opts_);
  service_ = std::make_unique<PsService>(opts_, [this] { begin_stop(10.0); });
  calls_ = std::make_unique<PsCallService>(*service_);
}

PsServer::~PsServer() { stop(1.0); }

std::string PsServer::address() const { return host_port(opts_.host, port_); }

int PsServer::start() {
  tune_process_once();
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) throw std::runtime_error("server already started");
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string addr = host_port(opts_.host, opts_.port);
  builder.AddListeningPort(addr, token_checking_credentials(*service_), &bound);
  builder.SetMaxReceiveMessageSize(opts_.max_message_bytes);
  builder.SetMaxSendMessageSize(opts_.max_message_bytes);
  grpc::ResourceQuota quota("cpu_dist_ps");
  quota.Resize(static_cast<size_t>(opts_.max_memory_bytes));
  builder.SetResourceQuota(quota);
  // One port, one shard: without this gRPC binds with SO_REUSEPORT, and a second shard on a
  // busy port would "listen" beside the first (two tables behind one address).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONCURRENT_STREAMS,
      static_cast<int>(std::min<uint32_t>(opts_.max_concurrent_streams, INT32_MAX)));
  builder.RegisterService(calls_->unary_methods());      // Pull, Push, Commit
  builder.RegisterCallbackGenericService(calls_.get());  // every other method
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    server_.reset();
    const std::string why = opts_.port != 0 ? bind_error(opts_.host, opts_.port) : std::string();
    if (why == "address already in use")
      throw std::runtime_error(absl::StrCat("could not listen on ", addr,
                                            ": address already in use (another process serves "
                                            "that port; one port serves one shard)"));
    throw std::runtime_error(
        absl::StrCat("could not listen on ", addr, why.empty() ? "" : ": ", why));
  }
  port_ = bound;
  started_ = true;
  sweeper_ = std::thread([this] { sweep_loop(); });
  return port_;
}

void PsServer::sweep_loop() {
  const auto idle = std::chrono::duration_cast<CommitSessions::Clock::duration>(
      std::chrono::duration<double>(opts_.session_idle_timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    const bool stopping = stopping_;
    lock.unlock();
    const auto now = CommitSessions::Clock::now();
    service_->sessions().expire_waiters(now, stopping);
    if (opts_.session_idle_timeout_s > 0) service_->sessions().expire_idle(now, idle);
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
