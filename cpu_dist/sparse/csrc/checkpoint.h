// A shard's checkpoint file: every row of every table it holds, with their optimizer state,
// each table's spec and the committed step, grouped by (table, partition) (hashing.h, the
// table's salted partition_of) so that a job with another shard count loads only the
// partitions it owns from each file.  The layout is defined once, in checkpoint_format.h
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

// What the header records beside the rows.
struct ShardMeta {
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t step = -1;
};

struct SaveResult {
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint32_t checksum = 0;  // header_crc
};

// One table to save: its spec as the header records it (table_fixed_of) and the table,
// which the caller holds frozen (no update lands meanwhile; pulls go on).
struct TableToSave {
  std::string name;
  TableFixed spec;  // rows and name_len are filled in by the save
  const ShardTable* table = nullptr;
};

// Writes every table (in the order given: name order) to `path` (format version 3; parent
// directories are created) in pieces of partitions, each copied out under the stripe locks
// and written with no lock held.  The caller holds every table frozen for the whole call, so
// the file is one consistent snapshot.
SaveResult save_shard(const std::vector<TableToSave>& tables, const ShardMeta& meta,
                      const std::string& path);

struct FileSpec {
  std::string path;
  uint64_t bytes = 0;     // 0: not checked against a manifest
  uint32_t checksum = 0;  // header_crc expected by the manifest (checked when bytes != 0)
};

// Rows of one table read from a checkpoint, built aside from the live table
// (ShardTable::adopt).
struct StagedTable {
  ShardTable* table = nullptr;  // the live table they are for
  std::unique_ptr<ShardTable::Staged> staged;
  size_t n = 0;
};

// A whole load: every table's staged rows, adopted together.
struct LoadedRows {
  // The tables of the checkpoint the shard lacked, built aside (ShardTables::build) and put on
  // the shard only when the load is adopted: a load that fails or is aborted leaves none.
  // Declared before `tables`, whose staged rows are theirs, so that they go last.
  std::vector<std::unique_ptr<ShardTable>> created;
  std::vector<StagedTable> tables;
  size_t n = 0;  // rows of every table
  int64_t step = -1;
};

// Every file of one checkpoint, opened for shard `shard_index` of `num_shards`: pass 1 of a
// load (every header read and checked: format, sizes, checksums; every file holds the same
// tables with the same specs and the same step; which file holds each partition of each table
// that this shard owns), so that a bad file is refused before gigabytes are read.  Then
// stage(t, ...) reads table t's owned partitions (pass 2).
class CheckpointFiles {
 public:
  CheckpointFiles(std::vector<FileSpec> files, uint32_t shard_index, uint32_t num_shards);
  ~CheckpointFiles();
  CheckpointFiles(const CheckpointFiles&) = delete;
  CheckpointFiles& operator=(const CheckpointFiles&) = delete;

  uint32_t version() const;  // of the files (all the same)
  int64_t step() const;
  // The tables the files hold, in file order (name order in version 3; one table in 1, 2,
  // whose spec beyond name and dim is unknown: zeros).
  const std::vector<TableHeader>& tables() const;
  // The first file's path (for messages).
  const std::string& first_path() const;

  // Table t's rows this shard owns, staged for `into` (not touching its live rows), checking
  // every block's checksum and keys (in the table's salted partitions) on the way.  `into`
  // must have the table's dim and state width (the caller checked the spec).
  StagedTable stage(size_t t, ShardTable& into) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpu_dist::ps::ckpt
