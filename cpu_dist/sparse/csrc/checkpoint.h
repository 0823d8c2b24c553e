// A shard's checkpoint file: every row it holds, with its optimizer state and the committed
// step, grouped by partition (hashing.h) so that a job with another shard count loads only
// the partitions it owns from each file.  The layout is defined once, in checkpoint_format.h
// (FixedHeader, FileHeader, encode_header / decode_header).
//
// The header checksum covers the partition checksums, so the manifest needs only the header
// checksum and the size of each file.  Files are written to a unique temporary name (opened
// with O_EXCL | O_NOFOLLOW), fsynced and renamed, and every directory created or changed on
// the way is fsynced; loading checks everything before the table is touched.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint_format.h"
#include "grpcpp/support/status.h"
#include "table.h"

namespace cpu_dist::ps::ckpt {

// A checkpoint that cannot be written or used; `code` is the gRPC status it maps to.
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(grpc::StatusCode code, const std::string& msg)
      : std::runtime_error(msg), code_(code) {}
  grpc::StatusCode code() const { return code_; }

 private:
  grpc::StatusCode code_;
};

struct ShardMeta {
  std::string table;
  uint32_t dim = 0;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t step = -1;
};

struct SaveResult {
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint32_t checksum = 0;  // header_crc
};

// Writes `table`, which the caller holds frozen (no update lands meanwhile; pulls go on), to
// `path` (parent directories are created) in pieces of partitions, each copied out under the
// stripe locks and written with no lock held.
SaveResult save_shard(const ShardTable& table, const ShardTable::Frozen& frozen,
                      const ShardMeta& meta, const std::string& path);

struct FileSpec {
  std::string path;
  uint64_t bytes = 0;     // 0: not checked against a manifest
  uint32_t checksum = 0;  // header_crc expected by the manifest (checked when bytes != 0)
};

// Rows read from a checkpoint, built aside from the live table (ShardTable::adopt).
struct LoadedRows {
  std::unique_ptr<ShardTable::Staged> staged;
  size_t n = 0;
  int64_t step = -1;
};

// Reads, from every file of one checkpoint, the partitions that shard `shard_index` of
// `num_shards` owns into rows staged for `table` (not touching its live rows), checking
// format, table name, dim, sizes and every checksum on the way.
LoadedRows load_for_shard(const std::vector<FileSpec>& files, const std::string& table_name,
                          const ShardTable& table, uint32_t shard_index, uint32_t num_shards);

}  // namespace cpu_dist::ps::ckpt
