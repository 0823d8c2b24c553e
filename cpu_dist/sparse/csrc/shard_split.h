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

// A row that its encoding cannot carry: `index` into the caller's arrays (of table `table`
// in a multi-table call).
struct EncodeFailure {
  size_t index = 0;
  uint32_t table = 0;
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

// ---- many tables in one call (proto TablePart) ---------------------------------------------

// One table's keys in a multi-table call: keys[i] for every i in `select` (or 0..n-1 when
// null), placed by the table's salted shard_of.
struct TableKeys {
  const int64_t* keys = nullptr;
  size_t n = 0;
  const std::vector<uint32_t>* select = nullptr;
  uint64_t salt = 0;
};

// A table's share of one RPC: idx[0..n) index that table's key (and row) arrays.
struct Segment {
  uint32_t table = 0;  // index into the call's tables
  const uint32_t* idx = nullptr;
  size_t n = 0;
};

// One RPC of a multi-table call: its tables' segments in table order (only tables with keys
// in this RPC), n keys in all.
struct MultiPart {
  uint32_t shard = 0;
  uint32_t channel = 0;
  uint32_t index = 0;  // of this part among its shard's parts
  uint32_t count = 0;  // parts of this shard
  std::vector<Segment> segments;
  size_t n = 0;
};

// What a multi-table part's request carries, per table: keys, and (Push, Commit) rows of the
// table's dim, encoded as `encoding`.
struct TablePayload {
  const int64_t* keys = nullptr;
  const float* rows = nullptr;
  uint32_t dim = 0;
};

// The keys of several tables cut into RPCs as ShardSplit cuts one table's: per shard, the
// tables' keys one after the other (table order), cut into parts of at most max_keys_per_rpc
// keys whatever the number of tables, so a step's 26 tables cost what one table's rows do.
class MultiSplit {
 public:
  MultiSplit(const std::vector<TableKeys>& tables, const SplitLimits& limits, SplitRule rule,
             uint32_t channel_base);
  MultiSplit(const MultiSplit&) = delete;  // parts point into by_shard_
  MultiSplit& operator=(const MultiSplit&) = delete;

  const std::vector<MultiPart>& parts() const { return parts_; }

  // `head` (scalar fields and the TablePart list) plus the part's keys and, where the
  // payloads have rows, its rows, each segment's at its table's dim, into `out`.
  static std::optional<EncodeFailure> serialize(const MultiPart& part,
                                                const google::protobuf::MessageLite& head,
                                                const std::vector<TablePayload>& payloads,
                                                int keys_field, int rows_field, Encoding encoding,
                                                grpc::ByteBuffer* out);

 private:
  std::vector<std::vector<std::vector<uint32_t>>> by_shard_;  // [shard][table]: positions
  std::vector<MultiPart> parts_;
};

}  // namespace cpu_dist::ps
