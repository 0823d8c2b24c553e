// The layout of a shard checkpoint file, little-endian, defined once here for the writer
// (checkpoint_save.cc) and the reader (checkpoint.cc).  Format version 3 (written) holds every
// table of the shard, each with its spec; versions 1 and 2 (one table, named in the header)
// are still read.
//
// Version 3:
//   FixedHeader                      48 bytes, the struct below; dim 0, table_len = the
//                                    number of tables T
//   T times, tables in name order:
//     TableFixed                     72 bytes, the struct below (the table's spec, rows)
//     char     name[name_len]
//     uint64   partition_rows[num_partitions]
//     uint64   partition_pending[num_partitions]   counts of keys without a row
//     uint32   partition_crc[num_partitions]       zlib crc32 of the partition's block
//   uint32   header_crc                            crc32 of every header byte before it
//   blocks, table by table (header order), partition 0 first, for partitions with rows or
//   counts (n rows, m counts); partitions are the table's salted partition_of (hashing.h):
//            int64 keys[n] (ascending), float32 values[n][dim], float32 state[n][state_floats],
//            int64 steps[n]     the last-update job step (row_meta.h kNoStep: none), then
//            int64 pending_keys[m], int64 counts[m], int64 last_seen[m]  (ascending)
//
// Versions 1 and 2 (one table, the default job's before tables):
//   FixedHeader                      the table's dim, table_len = bytes of its name
//   char     table[table_len]
//   uint64   partition_rows[num_partitions]
//   uint64   partition_pending[num_partitions]   version 2 only
//   uint32   partition_crc[num_partitions]
//   uint32   header_crc
//   blocks as above with state_floats 1; version 1 has no steps and no counts.
//
// encode_header and decode_header walk these fields in this order; every offset follows
// from the structs and the lengths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "hashing.h"

namespace cpu_dist::ps::ckpt {

inline constexpr uint32_t kFormatVersion = 3;        // written
inline constexpr uint32_t kOldestFormatVersion = 1;  // still read
inline constexpr uint32_t kMaxTables = 65536;        // a header naming more is corrupt

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint fields are copied as the host lays them out: little-endian only");

// The fixed-size start of the header.  Every field sits at a multiple of its own size, so
// the struct has no padding and is the on-disk bytes.
struct FixedHeader {
  char magic[8] = {  // FixedHeader().magic is the one definition of the magic
      'C', 'P', 'U', 'D', 'P', 'S', 'C', 'K'};
  uint32_t format_version = kFormatVersion;
  uint32_t dim = 0;  // versions 1, 2: the table's; 3: 0 (each table has its own)
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t step = -1;  // the last step whose updates the rows hold
  uint64_t rows = 0;  // of every table
  uint32_t num_partitions = kNumPartitions;
  uint32_t table_len = 0;  // versions 1, 2: bytes of the table name; 3: the number of tables
};
static_assert(std::is_trivially_copyable_v<FixedHeader> && std::is_standard_layout_v<FixedHeader>);
static_assert(sizeof(FixedHeader) == 48 && offsetof(FixedHeader, format_version) == 8 &&
                  offsetof(FixedHeader, step) == 24 && offsetof(FixedHeader, rows) == 32 &&
                  offsetof(FixedHeader, num_partitions) == 40 &&
                  offsetof(FixedHeader, table_len) == 44,
              "format version 1 and 2 layout");

// A table's fixed fields in version 3: its spec (ps.proto TableSpec; `optimizer` is that
// enum's number) and its rows.  No padding: the on-disk bytes.
struct TableFixed {
  uint32_t name_len = 0;
  uint32_t dim = 0;
  uint32_t optimizer = 0;     // ps.proto Optimizer: 0 SGD, 1 ROWWISE_ADAGRAD, 2 ADAGRAD
  uint32_t state_floats = 1;  // optimizer state per row: dim for ADAGRAD, else 1
  float init_scale = 0;
  float eps = 0;
  uint32_t admit_after = 0;
  uint32_t expire_after = 0;
  uint64_t seed = 0;
  uint64_t num_embeddings = 0;
  uint64_t rows = 0;
  uint64_t salt = 0;   // table_salt(name), recorded so that a reader can check its hash
  uint32_t flags = 0;  // kFlagDeclared
  uint32_t reserved = 0;
};
// TableFixed::flags: the table was declared by a shard's own flags (table_spec.h
// flag_declared: its optimizer is whichever each request names, `optimizer` only a default).
inline constexpr uint32_t kFlagDeclared = 1;
static_assert(std::is_trivially_copyable_v<TableFixed> && std::is_standard_layout_v<TableFixed>);
static_assert(sizeof(TableFixed) == 72 && offsetof(TableFixed, seed) == 32 &&
                  offsetof(TableFixed, salt) == 56 && offsetof(TableFixed, flags) == 64,
              "format version 3 table layout");

// One table's part of a header.
struct TableHeader {
  TableFixed fixed;
  std::string name;
  std::vector<uint64_t> partition_rows;     // num_partitions of them
  std::vector<uint64_t> partition_pending;  // version >= 2 (zeros in version 1)
  std::vector<uint32_t> partition_crc;
};

// A whole header.  Versions 1 and 2 decode into one TableHeader (name, dim from the fixed
// header, state_floats 1, optimizer and the rest of the spec unknown: 0).
struct FileHeader {
  FixedHeader fixed;
  std::vector<TableHeader> tables;
  uint32_t header_crc = 0;
};

// Bytes of h's header as encode_header writes it (of version h.fixed.format_version).
size_t header_size(const FileHeader& h);

// Bytes of one row and of one count in a block of that version.
inline size_t block_row_bytes(uint32_t dim, uint32_t state_floats, uint32_t version) {
  return sizeof(int64_t) + (size_t{dim} + state_floats) * sizeof(float) + (version >= 2 ? 8 : 0);
}
inline constexpr size_t kPendingBytes = 3 * sizeof(int64_t);

// zlib crc32 of n bytes, continuing from c (0 to start).
uint32_t crc32_of(uint32_t c, const void* data, size_t n);

// The header's bytes (of version fixed.format_version; 1 and 2 need exactly one table).
// Sets the lengths and counts (fixed.table_len, num_partitions, rows, each name_len) from the
// fields, and header_crc to the checksum of the bytes before it.  Every table's
// partition_crc and partition_pending must have as many entries as its partition_rows.
std::string encode_header(FileHeader& h);

// The fixed part, from sizeof(FixedHeader) bytes; nothing is checked.
FixedHeader decode_fixed(const char* bytes);

// Reads n bytes at offset off into out; false when the file ends first.
using ReadAt = std::function<bool(uint64_t off, void* out, size_t n)>;

// A header as read from a file.
struct DecodedHeader {
  FileHeader header;        // header_crc: the stored value
  uint64_t bytes = 0;       // the header's length (the first block starts there)
  uint32_t actual_crc = 0;  // crc32 of the header's bytes before header_crc
};

// Reads a whole header through `read`, field by field (a version 3 header's length follows
// from its tables' name lengths).  Checks only what reading needs: the magic, a version in
// [kOldestFormatVersion, kFormatVersion], num_partitions == kNumPartitions, names of at most
// kMaxNameBytes, at most kMaxTables tables.  Throws HeaderError (what is wrong, to be named
// with the file) otherwise, or when the file ends inside the header.
inline constexpr uint32_t kMaxNameBytes = 4096;
struct HeaderError {
  enum Kind { kTruncated, kBadMagic, kVersion, kCorrupt } kind;
  uint32_t version = 0;  // kVersion: the file's
};
DecodedHeader decode_header(const ReadAt& read);

}  // namespace cpu_dist::ps::ckpt
