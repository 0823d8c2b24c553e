#include "checkpoint_format.h"

#include <isa-l/crc.h>

#include <cstring>

namespace cpu_dist::ps::ckpt {

namespace {

// Appends plain values and arrays to a byte string.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void bytes(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  template <class T>
  void array(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }

 private:
  std::string* out_;
};

// Reads the same sequence back from a file, keeping the running checksum.
class Reader {
 public:
  explicit Reader(const ReadAt& read) : read_(read) {}
  void bytes(void* p, size_t n) {
    if (n > 0 && !read_(pos_, p, n)) throw HeaderError{HeaderError::kTruncated};
    crc_ = crc32_of(crc_, p, n);
    pos_ += n;
  }
  template <class T>
  void array(std::vector<T>& v, size_t n) {
    v.resize(n);
    bytes(v.data(), n * sizeof(T));
  }
  uint64_t pos() const { return pos_; }
  uint32_t crc() const { return crc_; }

 private:
  const ReadAt& read_;
  uint64_t pos_ = 0;
  uint32_t crc_ = 0;
};

size_t partition_arrays_bytes(size_t partitions, uint32_t version) {
  return partitions * (sizeof(uint64_t) * (version >= 2 ? 2 : 1) + sizeof(uint32_t));
}

}  // namespace

size_t header_size(const FileHeader& h) {
  const uint32_t version = h.fixed.format_version;
  size_t n = sizeof(FixedHeader) + sizeof(uint32_t);
  for (const TableHeader& t : h.tables) {
    if (version >= 3) n += sizeof(TableFixed);
    n += t.name.size() + partition_arrays_bytes(t.partition_rows.size(), version);
  }
  return n;
}

uint32_t crc32_of(uint32_t c, const void* data, size_t n) {
  // ISA-L's folding crc (the zlib/gzip polynomial, so files written with zlib's check the
  // same): 4.5x zlib's on this machine, where the checksum was a fifth of a restore's CPU.
  return crc32_gzip_refl(c, static_cast<const unsigned char*>(data), n);
}

std::string encode_header(FileHeader& h) {
  const uint32_t version = h.fixed.format_version;
  const uint32_t partitions =
      h.tables.empty() ? kNumPartitions : static_cast<uint32_t>(h.tables[0].partition_rows.size());
  h.fixed.num_partitions = partitions;
  h.fixed.rows = 0;
  for (TableHeader& t : h.tables) {
    t.fixed.name_len = static_cast<uint32_t>(t.name.size());
    t.fixed.rows = 0;
    for (uint64_t r : t.partition_rows) t.fixed.rows += r;
    h.fixed.rows += t.fixed.rows;
  }
  if (version >= 3) {
    h.fixed.dim = 0;
    h.fixed.table_len = static_cast<uint32_t>(h.tables.size());
  } else {
    h.fixed.dim = h.tables.at(0).fixed.dim;
    h.fixed.table_len = h.tables.at(0).fixed.name_len;
  }
  std::string out;
  out.reserve(header_size(h));
  Writer w(&out);
  w.bytes(&h.fixed, sizeof(FixedHeader));
  for (const TableHeader& t : h.tables) {
    if (version >= 3) w.bytes(&t.fixed, sizeof(TableFixed));
    w.bytes(t.name.data(), t.name.size());
    w.array(t.partition_rows);
    if (version >= 2) w.array(t.partition_pending);
    w.array(t.partition_crc);
  }
  h.header_crc = crc32_of(0, out.data(), out.size());
  w.bytes(&h.header_crc, sizeof(h.header_crc));
  return out;
}

FixedHeader decode_fixed(const char* bytes) {
  FixedHeader f;
  std::memcpy(&f, bytes, sizeof(FixedHeader));
  return f;
}

DecodedHeader decode_header(const ReadAt& read) {
  DecodedHeader d;
  FileHeader& h = d.header;
  Reader r(read);
  r.bytes(&h.fixed, sizeof(FixedHeader));
  if (std::memcmp(h.fixed.magic, FixedHeader().magic, sizeof(h.fixed.magic)) != 0)
    throw HeaderError{HeaderError::kBadMagic};
  const uint32_t version = h.fixed.format_version;
  if (version < kOldestFormatVersion || version > kFormatVersion)
    throw HeaderError{HeaderError::kVersion, version};
  if (h.fixed.num_partitions != kNumPartitions) throw HeaderError{HeaderError::kCorrupt};
  const uint32_t tables = version >= 3 ? h.fixed.table_len : 1;
  if (tables > kMaxTables) throw HeaderError{HeaderError::kCorrupt};
  h.tables.resize(tables);
  for (TableHeader& t : h.tables) {
    if (version >= 3) {
      r.bytes(&t.fixed, sizeof(TableFixed));
    } else {
      t.fixed.name_len = h.fixed.table_len;
      t.fixed.dim = h.fixed.dim;
      t.fixed.optimizer = 0;  // unknown: a version 1 or 2 file does not record it
      t.fixed.state_floats = 1;
      t.fixed.rows = h.fixed.rows;
    }
    if (t.fixed.name_len > kMaxNameBytes) throw HeaderError{HeaderError::kCorrupt};
    t.name.resize(t.fixed.name_len);
    r.bytes(t.name.data(), t.name.size());
    r.array(t.partition_rows, kNumPartitions);
    if (version >= 2) {
      r.array(t.partition_pending, kNumPartitions);
    } else {
      t.partition_pending.assign(kNumPartitions, 0);
    }
    r.array(t.partition_crc, kNumPartitions);
  }
  d.actual_crc = r.crc();
  r.bytes(&h.header_crc, sizeof(h.header_crc));
  d.bytes = r.pos();
  return d;
}

}  // namespace cpu_dist::ps::ckpt
