// The layout of a shard checkpoint file, little-endian, defined once here for the writer
// (checkpoint_save.cc) and the reader (checkpoint.cc).  Format version 2 (written) adds each
// row's last-update step and the admission counts (table_rules.h); version 1 is still read.
//
//   FixedHeader                               48 bytes, the struct below, byte for byte
//   char     table[table_len]
//   uint64   partition_rows[num_partitions]
//   uint64   partition_pending[num_partitions]   version 2 only: counts of keys without a row
//   uint32   partition_crc[num_partitions]   zlib crc32 of the partition's block
//   uint32   header_crc                      crc32 of every header byte before it
//   blocks, partition 0 first, for partitions with rows or counts (n rows, m counts):
//            int64 keys[n], float32 values[n][dim], float32 state[n]    (keys ascending)
//            version 2: int64 steps[n]           the last-update job step (row_meta.h kNoStep:
//                                                none), then
//                       int64 pending_keys[m], int64 counts[m], int64 last_seen[m]  (ascending)
//
// encode_header and decode_header walk these fields in this order; every offset follows
// from the struct and the lengths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "hashing.h"

namespace cpu_dist::ps::ckpt {

inline constexpr uint32_t kFormatVersion = 2;        // written
inline constexpr uint32_t kOldestFormatVersion = 1;  // still read

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint fields are copied as the host lays them out: little-endian only");

// The fixed-size start of the header.  Every field sits at a multiple of its own size, so
// the struct has no padding and is the on-disk bytes.
struct FixedHeader {
  char magic[8] = {  // FixedHeader().magic is the one definition of the magic
      'C', 'P', 'U', 'D', 'P', 'S', 'C', 'K'};
  uint32_t format_version = kFormatVersion;
  uint32_t dim = 0;
  uint32_t shard_index = 0;
  uint32_t num_shards = 1;
  int64_t step = -1;  // the last step whose updates the rows hold
  uint64_t rows = 0;
  uint32_t num_partitions = kNumPartitions;
  uint32_t table_len = 0;
};
static_assert(std::is_trivially_copyable_v<FixedHeader> && std::is_standard_layout_v<FixedHeader>);
static_assert(sizeof(FixedHeader) == 48 && offsetof(FixedHeader, format_version) == 8 &&
                  offsetof(FixedHeader, step) == 24 && offsetof(FixedHeader, rows) == 32 &&
                  offsetof(FixedHeader, num_partitions) == 40 &&
                  offsetof(FixedHeader, table_len) == 44,
              "format version 1 and 2 layout");

// A whole header.
struct FileHeader {
  FixedHeader fixed;
  std::string table;
  std::vector<uint64_t> partition_rows;     // fixed.num_partitions of them
  std::vector<uint64_t> partition_pending;  // version 2 (empty in version 1)
  std::vector<uint32_t> partition_crc;
  uint32_t header_crc = 0;
};

// Bytes of a whole header with a table name of table_len bytes.
size_t header_size(uint32_t table_len, uint32_t num_partitions = kNumPartitions,
                   uint32_t version = kFormatVersion);

// Bytes of one row and of one count in a block of that version.
inline size_t block_row_bytes(uint32_t dim, uint32_t version) {
  return sizeof(int64_t) + (size_t{dim} + 1) * sizeof(float) + (version >= 2 ? 8 : 0);
}
inline constexpr size_t kPendingBytes = 3 * sizeof(int64_t);

// zlib crc32 of n bytes, continuing from c (0 to start).
uint32_t crc32_of(uint32_t c, const void* data, size_t n);

// The header's bytes (of version fixed.format_version).  Sets fixed.table_len and
// fixed.num_partitions from the fields, and header_crc to the checksum of the bytes before
// it.  partition_crc (and in version 2 partition_pending) must have as many entries as
// partition_rows.
std::string encode_header(FileHeader& h);

// The fixed part, from sizeof(FixedHeader) bytes; nothing is checked.
FixedHeader decode_fixed(const char* bytes);

// A whole header from header_size(table_len, num_partitions, version) bytes (the lengths
// and version as decode_fixed read them); header_crc is the stored value, nothing is checked.
FileHeader decode_header(const std::string& bytes);

}  // namespace cpu_dist::ps::ckpt
