// How the client cuts one pull, push or commit into RPCs: keys grouped by shard
// (cpu_dist::shard_of), each shard's keys cut into parts of at most max_keys_per_rpc, each
// part a request whose key (and row) payload is gathered straight into the gRPC buffer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "codec.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"

namespace cpu_dist::ps {

// Per-shard requests of at least this many keys per part are split over channels
// (PLATFORM.md: 2 parts help at 4096 keys; small pulls gain nothing).
inline constexpr size_t kSplitMinKeys = 1024;

enum class SplitRule {
  // Parts of at most max_keys_per_rpc, and large requests spread over the shard's channels
  // (kSplitMinKeys keys per part at least); a shard without keys gets no call.  Pull, Push.
  kSpreadOverChannels,
  // Chunks of at most max_keys_per_rpc, and at least one per shard (an empty marker chunk:
  // every shard hears from every rank).  Commit.
  kChunkEveryShard,
};

struct SplitLimits {
  uint32_t num_shards = 1;
  uint32_t max_keys_per_rpc = 1;
  uint32_t channels_per_shard = 1;
};

// One RPC's share: idx[0..n) index the caller's key (and row) arrays, in input order.
struct Part {
  uint32_t shard = 0;
  uint32_t channel = 0;  // < channels_per_shard
  uint32_t index = 0;    // of this part among its shard's parts
  uint32_t count = 0;    // parts of this shard
  const uint32_t* idx = nullptr;
  size_t n = 0;
};

// What a part's request carries: keys as bytes field `keys_field`, and with `rows` one row
// of `dim` floats per key as bytes field `rows_field`, encoded as `encoding` says (codec.h).
struct PartPayload {
  const int64_t* keys = nullptr;
  int keys_field = 0;
  const float* rows = nullptr;
  int rows_field = 0;
  uint32_t dim = 0;
  Encoding encoding = Encoding::kNone;
};

// A row that its encoding cannot carry: `index` into the caller's arrays.
struct EncodeFailure {
  size_t index = 0;
  CodecError error;
};

class ShardSplit {
 public:
  // Groups keys[i] by shard, for every i in `select` (positions into keys), or for i in
  // 0..n-1 when select is null.  Part p of a shard goes to channel (channel_base + p).
  // `keys` is read here only; the split keeps no pointer to it.
  ShardSplit(const int64_t* keys, size_t n, const std::vector<uint32_t>* select,
             const SplitLimits& limits, SplitRule rule, uint32_t channel_base);
  ShardSplit(const ShardSplit&) = delete;  // parts point into by_shard_
  ShardSplit& operator=(const ShardSplit&) = delete;

  const std::vector<Part>& parts() const { return parts_; }

  // `head` (the scalar fields) plus the part's keys and encoded rows, into `out`.  A row
  // the encoding cannot carry stops it (`out` is then not a request to send).  kNone rows
  // are copied unchecked: the caller has checked them (they are finite).
  static std::optional<EncodeFailure> serialize(const Part& part,
                                                const google::protobuf::MessageLite& head,
                                                const PartPayload& payload, grpc::ByteBuffer* out);

 private:
  std::vector<std::vector<uint32_t>> by_shard_;
  std::vector<Part> parts_;
};

}  // namespace cpu_dist::ps
