// The client's call plumbing: one outstanding unary RPC (Call), a group of them finishing
// together behind a Python Handle (AsyncOp), and the traffic counters every successful call
// adds to.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "grpcpp/alarm.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace cpu_dist::ps {

// A failed RPC: "shard I (ADDR): CODE: message", with the shard, its address and the status
// code's name as fields (Python's PSError has them as attributes: nobody parses the text).
// Fields a failure does not have (a malformed reply has no status code) are empty.
class RpcError : public std::runtime_error {
 public:
  explicit RpcError(const std::string& message, std::optional<uint32_t> shard = std::nullopt,
                    std::string address = {}, std::string code = {})
      : std::runtime_error(message),
        shard_(shard),
        address_(std::move(address)),
        code_(std::move(code)) {}
  const std::optional<uint32_t>& shard() const { return shard_; }
  const std::string& address() const { return address_; }  // empty: unknown
  const std::string& code() const { return code_; }        // e.g. "UNAVAILABLE"; empty: none

 private:
  std::optional<uint32_t> shard_;
  std::string address_;
  std::string code_;
};
// A wait that ran out of time (WaitCommitted, Handle.wait).
class WaitTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* code_name(grpc::StatusCode c);

// Rows an operation owns until Python takes them (malloc'd: no zero fill of a buffer that
// the replies overwrite whole).
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using RowBuffer = std::unique_ptr<float[], FreeDeleter>;
RowBuffer alloc_rows(size_t floats);  // throws std::bad_alloc

// Which client counter a successful call adds its payload to.
enum class TrafficKind : uint8_t { kNone, kPull, kPush };

struct TrafficCounts {
  // Payload bytes as encoded on the wire (codec.h): a compressed pull or update counts its
  // encoded rows, not the float32 rows they stand for.
  uint64_t bytes_pulled = 0;  // key bytes sent in Pull requests + row bytes in Pull replies
  uint64_t bytes_pushed = 0;  // key + gradient bytes sent in Push and Commit requests
  uint64_t keys_pulled = 0;
  uint64_t keys_pushed = 0;
  uint64_t retries = 0;  // RPCs sent again after UNAVAILABLE (Pull, Commit)
};

// Payload bytes as they cross the wire (keys included, protobuf framing not); calls finish
// on several threads, so every counter is atomic.
class Traffic {
 public:
  void add(TrafficKind kind, uint64_t keys, uint64_t bytes);
  void add_retry() { retries_.fetch_add(1, std::memory_order_relaxed); }
  TrafficCounts snapshot() const;

 private:
  std::atomic<uint64_t> bytes_pulled_{0}, bytes_pushed_{0}, keys_pulled_{0}, keys_pushed_{0},
      retries_{0};
};

// A PullReport step for a row whose reply gave no bound (row_steps 255).
inline constexpr int64_t kUnknownStep = std::numeric_limits<int64_t>::min();

// What the replies of one pull report beside its rows (a pull that names a commit session):
// the smallest committed step (replies decode on several threads, so an atomic minimum) and,
// when the pull asked for them, per row (at the row's position in the pull) the session step
// up to which it holds every commit (PullResponse.row_steps) and its optimizer state
// (`state_width` floats per row: 1, or dim for element-wise Adagrad).  The decoders write
// disjoint positions of the per-row arrays.  A multi-table pull has one per table.
class PullReport {
 public:
  PullReport(size_t n, bool steps, bool states, uint32_t state_width = 1)
      : steps_(steps ? n : 0, 0),
        states_(states ? n * state_width : 0, 0.0f),
        want_steps_(steps),
        want_states_(states),
        state_width_(state_width) {}
  void note(int64_t step) {
    int64_t cur = min_.load(std::memory_order_relaxed);
    while (step < cur && !min_.compare_exchange_weak(cur, step, std::memory_order_relaxed)) {
    }
  }
  // nullopt when no reply reported one (no call was made).
  std::optional<int64_t> value() const {
    const int64_t v = min_.load(std::memory_order_relaxed);
    return v == kNone ? std::nullopt : std::optional<int64_t>(v);
  }
  bool wants_steps() const { return want_steps_; }
  bool wants_states() const { return want_states_; }
  uint32_t state_width() const { return state_width_; }
  int64_t* steps() { return steps_.data(); }
  float* states() { return states_.data(); }
  const std::vector<int64_t>& steps() const { return steps_; }
  const std::vector<float>& states() const { return states_; }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::atomic<int64_t> min_{kNone};
  std::vector<int64_t> steps_;
  std::vector<float> states_;
  bool want_steps_, want_states_;
  uint32_t state_width_;
};

class AsyncOp;

// One outstanding unary RPC over the generic (raw bytes) stub.  An idempotent one (Pull,
// Commit) may be sent again after UNAVAILABLE, each attempt with a fresh context and the
// same deadline; between attempts `alarm` holds the back-off, with the call as its tag.
struct Call {
  uint32_t shard = 0;
  uint32_t channel = 0;
  const char* method = nullptr;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientContext> ctx;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  std::chrono::system_clock::time_point deadline;
  bool idempotent = false;
  uint32_t retries = 0;      // attempts after the first
  bool backing_off = false;  // the next completion of this tag is the alarm
  std::unique_ptr<grpc::Alarm> alarm;
  // Decodes a successful reply; a non-OK result marks the call failed (malformed reply).
  std::function<grpc::Status(Call&)> on_reply;
  // Counted once the call succeeded (reply decoded).
  TrafficKind traffic = TrafficKind::kNone;
  uint64_t traffic_keys = 0;
  uint64_t traffic_bytes = 0;
  AsyncOp* op = nullptr;
};
using Calls = std::vector<std::unique_ptr<Call>>;

// The state behind a Python Handle: done when every call finished.
class AsyncOp {
 public:
  // `on_success` runs on the completion thread after the last call, only if every call
  // succeeded, before waiters see the op done.  `outputs` is what a pull_async op decodes
  // its replies into (one buffer per table), `seen` what its replies report committed steps
  // to (one report per table; empty, or null entries, when the pull named no session).
  AsyncOp(Calls calls, std::function<RpcError(const Call&)> describe,
          std::function<void()> on_success = {}, std::vector<RowBuffer> outputs = {},
          std::vector<std::shared_ptr<const PullReport>> seen = {});
  // True when done within timeout_s (< 0: forever).
  bool wait(double timeout_s);
  bool done();
  // Empty when every call succeeded, else the first failed call (in call order) described.
  std::string error();
  // Throws RpcError with error() when the op failed.
  void raise_if_failed();
  // The rows of a successful pull_async (once; null afterwards, or for other ops); of a
  // multi-table one, table `table`'s.
  RowBuffer take_output(size_t table = 0);
  // Of a successful pull_async that named a session, once done: the minimum committed step
  // over the shards it touched (every table's); nullopt otherwise.
  std::optional<int64_t> committed_seen();
  // Of a successful pull_async that named a session, once done: all its replies reported
  // (of a multi-table one, table `table`'s share); null otherwise.
  std::shared_ptr<const PullReport> report(size_t table = 0);
  Calls& calls() { return calls_; }
  // Called by the completion thread once per call, after the call was settled; true when
  // this was the last call (the op is done).
  bool finish_call();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  Calls calls_;
  size_t remaining_;  // calls not finished yet
  bool done_ = false;
  std::optional<RpcError> error_;
  std::function<RpcError(const Call&)> describe_;
  std::function<void()> on_success_;
  std::vector<RowBuffer> outputs_;
  std::vector<std::shared_ptr<const PullReport>> seen_;
};

}  // namespace cpu_dist::ps
