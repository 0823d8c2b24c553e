// Byte-level helpers shared by service and client: protobuf <-> grpc::ByteBuffer without
// intermediate std::strings, and hand-encoded `bytes` fields so that bulk payloads (keys,
// rows, gradients) are copied exactly once into the buffer gRPC sends.  Field numbers come
// from protoc's generated constants (e.g. PullRequest::kKeysFieldNumber), never literals.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "google/protobuf/message_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace cpu_dist::ps::wire {

inline constexpr size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline uint8_t* put_varint(uint64_t v, uint8_t* p) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// The tag of a length-delimited field (wire type 2): 0x0A for field 1.
inline constexpr uint64_t bytes_tag(int field) { return (static_cast<uint64_t>(field) << 3) | 2; }

// Size of a length-delimited field: tag, length, payload.
inline constexpr size_t bytes_field_size(int field, size_t len) {
  return varint_size(bytes_tag(field)) + varint_size(len) + len;
}

inline uint8_t* put_bytes_header(int field, size_t len, uint8_t* p) {
  return put_varint(len, put_varint(bytes_tag(field), p));
}

// The tag of a varint field (wire type 0): 0x10 for field 2.
inline constexpr uint64_t varint_tag(int field) { return static_cast<uint64_t>(field) << 3; }

// Size of an int64 varint field (a negative value takes 10 bytes, as protobuf writes it).
inline constexpr size_t int64_field_size(int field, int64_t v) {
  return varint_size(varint_tag(field)) + varint_size(static_cast<uint64_t>(v));
}

inline uint8_t* put_int64_field(int field, int64_t v, uint8_t* p) {
  return put_varint(static_cast<uint64_t>(v), put_varint(varint_tag(field), p));
}

// Wraps a freshly malloc'd slice into `out` (ownership moves to the ByteBuffer) and returns
// where to write.  Always a refcounted slice: grpc_slice_malloc would inline small sizes into
// the slice struct itself, which is copied below, so writes through the pointer would be lost.
inline uint8_t* alloc_buffer(size_t n, grpc::ByteBuffer* out) {
  grpc_slice s = grpc_slice_malloc_large(n);
  // Not GRPC_SLICE_START_PTR: its inlined branch points into the local `s` (the compiler
  // rightly warns); a malloc_large slice is always refcounted, with the bytes on the heap.
  grpc::Slice slice(s, grpc::Slice::STEAL_REF);
  if (s.refcount == nullptr) throw std::bad_alloc();  // cannot happen; never write into `s`
  uint8_t* p = s.data.refcounted.bytes;
  grpc::ByteBuffer bb(&slice, 1);
  out->Swap(&bb);
  return p;
}

inline void serialize(const google::protobuf::MessageLite& m, grpc::ByteBuffer* out) {
  const size_t n = m.ByteSizeLong();
  uint8_t* p = alloc_buffer(n, out);
  m.SerializeWithCachedSizesToArray(p);
}

// A bulk `bytes` field: where the bytes are written is left to the caller (Reserve), or they
// are copied from `data` (Payload).
struct Reserve {
  int field;
  size_t len;
};
struct Payload {
  int field;
  const void* data;
  size_t len;
};

// `head` (the small scalar fields) followed by the bulk fields, each with its header; returns
// where each field's bytes must be written (null for empty ones, which proto3 omits).
// Protobuf accepts fields in any order, so this is a valid encoding of the full message.
template <size_t N>
std::array<uint8_t*, N> serialize_reserving(const google::protobuf::MessageLite& head,
                                            const std::array<Reserve, N>& fields,
                                            grpc::ByteBuffer* out) {
  size_t total = head.ByteSizeLong();
  for (const Reserve& r : fields)
    if (r.len > 0) total += bytes_field_size(r.field, r.len);
  uint8_t* p = alloc_buffer(total, out);
  p = head.SerializeWithCachedSizesToArray(p);
  std::array<uint8_t*, N> where{};
  for (size_t i = 0; i < N; ++i) {
    if (fields[i].len == 0) continue;
    p = put_bytes_header(fields[i].field, fields[i].len, p);
    where[i] = p;
    p += fields[i].len;
  }
  return where;
}

// Like serialize_reserving, with the payloads copied in.
template <size_t N>
void serialize_with_payloads(const google::protobuf::MessageLite& head,
                             const std::array<Payload, N>& payloads, grpc::ByteBuffer* out) {
  std::array<Reserve, N> fields;
  for (size_t i = 0; i < N; ++i) fields[i] = {payloads[i].field, payloads[i].len};
  const std::array<uint8_t*, N> where = serialize_reserving(head, fields, out);
  for (size_t i = 0; i < N; ++i)
    if (payloads[i].len > 0) std::memcpy(where[i], payloads[i].data, payloads[i].len);
}

// Parses straight from gRPC's slices: a commit chunk arrives as dozens of slices, and joining
// them first copied every gradient byte once more than the parse itself does.  The reader
// takes a mutable buffer, so it reads a copy of the handle (its slices are shared, not copied).
inline bool parse(const grpc::ByteBuffer& bb, google::protobuf::MessageLite* m) {
  if (!bb.Valid()) return m->ParseFromArray(nullptr, 0);
  grpc::ByteBuffer shared(bb);
  grpc::ProtoBufferReader reader(&shared);
  return reader.status().ok() && m->ParseFromZeroCopyStream(&reader);
}

// Reads a ByteBuffer sequentially across its slices.
class SliceReader {
 public:
  explicit SliceReader(const grpc::ByteBuffer& bb) {
    if (bb.Valid()) (void)bb.Dump(&slices_);
    for (const auto& s : slices_) remaining_ += s.size();
  }
  size_t remaining() const { return remaining_; }
  bool read(void* dst, size_t n) {
    if (n > remaining_) return false;
    char* d = static_cast<char*>(dst);
    while (n > 0) {
      const grpc::Slice& s = slices_[idx_];
      const size_t take = std::min(n, s.size() - off_);
      std::memcpy(d, s.begin() + off_, take);
      d += take;
      n -= take;
      off_ += take;
      remaining_ -= take;
      if (off_ == s.size()) {
        ++idx_;
        off_ = 0;
      }
    }
    return true;
  }
  // The next n bytes where they lie inside one slice (and skips them); null otherwise (then
  // nothing is consumed: read() them).
  const uint8_t* contiguous(size_t n) {
    if (n > remaining_ || idx_ >= slices_.size() || slices_[idx_].size() - off_ < n) return nullptr;
    const uint8_t* p = slices_[idx_].begin() + off_;
    off_ += n;
    remaining_ -= n;
    if (off_ == slices_[idx_].size()) {
      ++idx_;
      off_ = 0;
    }
    return p;
  }
  // Whether the next byte (if any) is `byte`; nothing read.
  bool next_byte_is(uint8_t byte) const {
    for (size_t i = idx_, off = off_; i < slices_.size(); ++i, off = 0)
      if (off < slices_[i].size()) return slices_[i].begin()[off] == byte;
    return false;
  }
  bool read_varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!read(&b, 1)) return false;
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // The header of a length-delimited field `field`; false if the next bytes are not one.
  bool read_bytes_header(int field, uint64_t* len) {
    uint64_t tag = 0;
    return read_varint(&tag) && tag == bytes_tag(field) && read_varint(len);
  }
  // The header of a length-delimited field that protobuf leaves out when it is empty: *len
  // 0, nothing read, when the next field is another (`field` < 16: a one-byte tag).
  bool read_bytes_header_or_empty(int field, uint64_t* len) {
    if (!next_byte_is(static_cast<uint8_t>(bytes_tag(field)))) {
      *len = 0;
      return true;
    }
    return read_bytes_header(field, len);
  }
  // An int64 varint field `field`; false if the next bytes are not one.
  bool read_int64_field(int field, int64_t* v) {
    uint64_t tag = 0, u = 0;
    if (!read_varint(&tag) || tag != varint_tag(field) || !read_varint(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }

 private:
  std::vector<grpc::Slice> slices_;
  size_t idx_ = 0, off_ = 0, remaining_ = 0;
};

}  // namespace cpu_dist::ps::wire
