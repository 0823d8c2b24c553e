#include "checkpoint_format.h"

#include <isa-l/crc.h>

#include <cstring>
#include <stdexcept>

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

// Reads the same sequence back (the caller sized the input).
class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  void bytes(void* p, size_t n) {
    if (n > in_.size() - pos_) throw std::length_error("checkpoint header shorter than its fields");
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  template <class T>
  void array(std::vector<T>& v, size_t n) {
    v.resize(n);
    bytes(v.data(), n * sizeof(T));
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

size_t header_size(uint32_t table_len, uint32_t num_partitions, uint32_t version) {
  const size_t per = sizeof(uint64_t) * (version >= 2 ? 2 : 1) + sizeof(uint32_t);
  return sizeof(FixedHeader) + table_len + size_t{num_partitions} * per + sizeof(uint32_t);
}

uint32_t crc32_of(uint32_t c, const void* data, size_t n) {
  // ISA-L's folding crc (the zlib/gzip polynomial, so files written with zlib's check the
  // same): 4.5x zlib's on this machine, where the checksum was a fifth of a restore's CPU.
  return crc32_gzip_refl(c, static_cast<const unsigned char*>(data), n);
}

std::string encode_header(FileHeader& h) {
  h.fixed.table_len = static_cast<uint32_t>(h.table.size());
  h.fixed.num_partitions = static_cast<uint32_t>(h.partition_rows.size());
  std::string out;
  out.reserve(header_size(h.fixed.table_len, h.fixed.num_partitions, h.fixed.format_version));
  Writer w(&out);
  w.bytes(&h.fixed, sizeof(FixedHeader));
  w.bytes(h.table.data(), h.table.size());
  w.array(h.partition_rows);
  if (h.fixed.format_version >= 2) w.array(h.partition_pending);
  w.array(h.partition_crc);
  h.header_crc = crc32_of(0, out.data(), out.size());
  w.bytes(&h.header_crc, sizeof(h.header_crc));
  return out;
}

FixedHeader decode_fixed(const char* bytes) {
  FixedHeader f;
  std::memcpy(&f, bytes, sizeof(FixedHeader));
  return f;
}

FileHeader decode_header(const std::string& bytes) {
  FileHeader h;
  Reader r(bytes);
  r.bytes(&h.fixed, sizeof(FixedHeader));
  h.table.resize(h.fixed.table_len);
  r.bytes(h.table.data(), h.table.size());
  r.array(h.partition_rows, h.fixed.num_partitions);
  if (h.fixed.format_version >= 2) {
    r.array(h.partition_pending, h.fixed.num_partitions);
  } else {
    h.partition_pending.assign(h.fixed.num_partitions, 0);
  }
  r.array(h.partition_crc, h.fixed.num_partitions);
  r.bytes(&h.header_crc, sizeof(h.header_crc));
  return h;
}

}  // namespace cpu_dist::ps::ckpt
