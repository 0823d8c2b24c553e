#include "rpc_call.h"

#include <algorithm>
#include <chrono>
#include <new>

namespace cpu_dist::ps {

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN";
  }
}

RowBuffer alloc_rows(size_t floats) {
  RowBuffer b(static_cast<float*>(std::malloc(std::max<size_t>(floats, 1) * sizeof(float))));
  if (b == nullptr) throw std::bad_alloc();
  return b;
}

// ---- Traffic ----------------------------------------------------------------------------

void Traffic::add(TrafficKind kind, uint64_t keys, uint64_t bytes) {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (kind == TrafficKind::kPull) {
    keys_pulled_.fetch_add(keys, relaxed);
    bytes_pulled_.fetch_add(bytes, relaxed);
  } else if (kind == TrafficKind::kPush) {
    keys_pushed_.fetch_add(keys, relaxed);
    bytes_pushed_.fetch_add(bytes, relaxed);
  }
}

TrafficCounts Traffic::snapshot() const {
  TrafficCounts t;
  t.bytes_pulled = bytes_pulled_.load();
  t.bytes_pushed = bytes_pushed_.load();
  t.keys_pulled = keys_pulled_.load();
  t.keys_pushed = keys_pushed_.load();
  t.retries = retries_.load();
  return t;
}

// ---- AsyncOp ----------------------------------------------------------------------------

AsyncOp::AsyncOp(Calls calls, std::function<RpcError(const Call&)> describe,
                 std::function<void()> on_success, std::vector<RowBuffer> outputs,
                 std::vector<std::shared_ptr<const PullReport>> seen)
    : calls_(std::move(calls)),
      remaining_(calls_.size()),
      done_(calls_.empty()),
      describe_(std::move(describe)),
      on_success_(std::move(on_success)),
      outputs_(std::move(outputs)),
      seen_(std::move(seen)) {
  for (auto& c : calls_) c->op = this;
  if (done_ && on_success_) on_success_();
}

bool AsyncOp::finish_call() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--remaining_ > 0) return false;
  }
  // The last call: no other thread touches the calls or the output any more.
  std::optional<RpcError> error;
  for (const auto& call : calls_)
    if (!call->status.ok()) {
      error.emplace(describe_(*call));
      break;
    }
  if (!error && on_success_) on_success_();
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
  return true;
}

bool AsyncOp::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [this] { return done_; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done_; });
}

bool AsyncOp::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::string AsyncOp::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_ ? std::string(error_->what()) : std::string();
}

void AsyncOp::raise_if_failed() {
  std::optional<RpcError> err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = error_;
  }
  if (err) throw *err;
}

RowBuffer AsyncOp::take_output(size_t table) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || error_ || table >= outputs_.size()) return nullptr;
  return std::move(outputs_[table]);
}

std::optional<int64_t> AsyncOp::committed_seen() {
  std::optional<int64_t> lo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ || error_) return std::nullopt;
  }
  for (const auto& r : seen_) {  // fixed once done: no lock needed to read
    if (r == nullptr) continue;
    const std::optional<int64_t> v = r->value();
    if (v && (!lo || *v < *lo)) lo = v;
  }
  return lo;
}

std::shared_ptr<const PullReport> AsyncOp::report(size_t table) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_ || error_ || table >= seen_.size()) return nullptr;
  return seen_[table];
}

}  // namespace cpu_dist::ps
