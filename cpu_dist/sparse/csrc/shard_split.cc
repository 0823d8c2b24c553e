#include "shard_split.h"

#include <algorithm>
#include <cstring>

#include "hashing.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

size_t parts_for(size_t m, const SplitLimits& lim, SplitRule rule) {
  const size_t by_size = (m + lim.max_keys_per_rpc - 1) / lim.max_keys_per_rpc;
  if (rule == SplitRule::kChunkEveryShard) return std::max<size_t>(by_size, 1);
  if (m == 0) return 0;
  const size_t by_channels = std::min<size_t>(lim.channels_per_shard, m / kSplitMinKeys);
  return std::max<size_t>({by_size, by_channels, 1});
}

}  // namespace

ShardSplit::ShardSplit(const int64_t* keys, size_t n, const std::vector<uint32_t>* select,
                       const SplitLimits& limits, SplitRule rule, uint32_t channel_base)
    : by_shard_(limits.num_shards) {
  const uint32_t ns = limits.num_shards;
  auto add = [&](uint32_t i) { by_shard_[ns == 1 ? 0 : shard_of(keys[i], ns)].push_back(i); };
  if (select != nullptr) {
    for (uint32_t i : *select) add(i);
  } else {
    for (size_t i = 0; i < n; ++i) add(static_cast<uint32_t>(i));
  }
  for (uint32_t s = 0; s < ns; ++s) {
    const std::vector<uint32_t>& idx = by_shard_[s];
    const size_t m = idx.size();
    const size_t count = parts_for(m, limits, rule);
    for (size_t p = 0; p < count; ++p) {
      const size_t b = m * p / count, e = m * (p + 1) / count;
      Part part;
      part.shard = s;
      part.channel = (channel_base + static_cast<uint32_t>(p)) % limits.channels_per_shard;
      part.index = static_cast<uint32_t>(p);
      part.count = static_cast<uint32_t>(count);
      part.idx = idx.data() + b;
      part.n = e - b;
      parts_.push_back(part);
    }
  }
}

std::optional<EncodeFailure> ShardSplit::serialize(const Part& part,
                                                   const google::protobuf::MessageLite& head,
                                                   const PartPayload& pl, grpc::ByteBuffer* out) {
  const bool has_rows = pl.rows != nullptr;
  const size_t row_bytes = has_rows ? encoded_row_bytes(pl.encoding, pl.dim) : 0;
  const size_t floats_bytes = size_t{pl.dim} * sizeof(float);
  const auto where =
      wire::serialize_reserving<2>(head,
                                   {wire::Reserve{pl.keys_field, part.n * sizeof(int64_t)},
                                    wire::Reserve{pl.rows_field, part.n * row_bytes}},
                                   out);
  for (size_t j = 0; j < part.n; ++j) {
    const size_t i = part.idx[j];
    std::memcpy(where[0] + j * sizeof(int64_t), &pl.keys[i], sizeof(int64_t));
    if (!has_rows) continue;
    const float* row = pl.rows + i * pl.dim;
    uint8_t* dst = where[1] + j * row_bytes;
    if (pl.encoding == Encoding::kNone) {
      std::memcpy(dst, row, floats_bytes);
      continue;
    }
    EncodeFailure f;
    if (!encode_row(pl.encoding, row, pl.dim, dst, &f.error)) {
      f.index = i;
      return f;
    }
  }
  return std::nullopt;
}

MultiSplit::MultiSplit(const std::vector<TableKeys>& tables, const SplitLimits& limits,
                       SplitRule rule, uint32_t channel_base)
    : by_shard_(limits.num_shards, std::vector<std::vector<uint32_t>>(tables.size())) {
  const uint32_t ns = limits.num_shards;
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableKeys& tk = tables[t];
    auto add = [&](uint32_t i) {
      by_shard_[ns == 1 ? 0 : shard_of(tk.keys[i], tk.salt, ns)][t].push_back(i);
    };
    if (tk.select != nullptr) {
      for (uint32_t i : *tk.select) add(i);
    } else {
      for (size_t i = 0; i < tk.n; ++i) add(static_cast<uint32_t>(i));
    }
  }
  for (uint32_t s = 0; s < ns; ++s) {
    const std::vector<std::vector<uint32_t>>& per_table = by_shard_[s];
    size_t m = 0;
    for (const auto& v : per_table) m += v.size();
    const size_t count = parts_for(m, limits, rule);
    // Part p covers [m p / count, m (p+1) / count) of the shard's tables laid end to end.
    size_t t = 0, offset = 0;  // where the walk is: table t, its position offset
    for (size_t p = 0; p < count; ++p) {
      const size_t e = m * (p + 1) / count;
      MultiPart part;
      part.shard = s;
      part.channel = (channel_base + static_cast<uint32_t>(p)) % limits.channels_per_shard;
      part.index = static_cast<uint32_t>(p);
      part.count = static_cast<uint32_t>(count);
      part.n = e - m * p / count;
      for (size_t left = part.n; left > 0;) {
        while (offset == per_table[t].size()) {
          ++t;
          offset = 0;
        }
        const size_t take = std::min(left, per_table[t].size() - offset);
        part.segments.push_back(
            Segment{static_cast<uint32_t>(t), per_table[t].data() + offset, take});
        offset += take;
        left -= take;
      }
      parts_.push_back(std::move(part));
    }
  }
}

std::optional<EncodeFailure> MultiSplit::serialize(const MultiPart& part,
                                                   const google::protobuf::MessageLite& head,
                                                   const std::vector<TablePayload>& payloads,
                                                   int keys_field, int rows_field,
                                                   Encoding encoding, grpc::ByteBuffer* out) {
  size_t rows_bytes = 0;
  for (const Segment& sg : part.segments) {
    const TablePayload& pl = payloads[sg.table];
    if (pl.rows != nullptr) rows_bytes += sg.n * encoded_row_bytes(encoding, pl.dim);
  }
  const auto where = wire::serialize_reserving<2>(
      head,
      {wire::Reserve{keys_field, part.n * sizeof(int64_t)}, wire::Reserve{rows_field, rows_bytes}},
      out);
  uint8_t* key_dst = where[0];
  uint8_t* row_dst = where[1];
  for (const Segment& sg : part.segments) {
    const TablePayload& pl = payloads[sg.table];
    const size_t row_bytes = pl.rows != nullptr ? encoded_row_bytes(encoding, pl.dim) : 0;
    for (size_t j = 0; j < sg.n; ++j) {
      const size_t i = sg.idx[j];
      std::memcpy(key_dst, &pl.keys[i], sizeof(int64_t));
      key_dst += sizeof(int64_t);
      if (pl.rows == nullptr) continue;
      const float* row = pl.rows + i * pl.dim;
      if (encoding == Encoding::kNone) {
        std::memcpy(row_dst, row, size_t{pl.dim} * sizeof(float));
      } else {
        EncodeFailure f;
        if (!encode_row(encoding, row, pl.dim, row_dst, &f.error)) {
          f.index = i;
          f.table = sg.table;
          return f;
        }
      }
      row_dst += row_bytes;
    }
  }
  return std::nullopt;
}

}  // namespace cpu_dist::ps
