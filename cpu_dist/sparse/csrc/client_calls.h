// Pieces shared by the client's data operations (client.cc: one table; client_tables.cc:
// many tables in one call).  Internal to the client library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client.h"
#include "codec.h"
#include "method_paths.h"
#include "optimizer.h"
#include "ps.pb.h"
#include "shard_split.h"
#include "wire.h"

namespace cpu_dist::ps::client_calls {

using paths::kCommit;
using paths::kPull;
using paths::kPullCommitted;
using paths::kPush;

// Row-count arguments index with uint32_t (positions, slot ids): refuse what would wrap.
inline void check_count(size_t n) {
  if (n > UINT32_MAX)
    throw std::invalid_argument(
        absl::StrCat(n, " keys in one call: at most ", UINT32_MAX, " are supported"));
}

inline std::chrono::system_clock::time_point deadline_in(double s) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(s));
}

inline Optimizer to_proto(OptimizerKind k) {  // equal values (optimizer.h)
  return static_cast<Optimizer>(static_cast<int>(k));
}

inline Compression to_proto(Encoding e) { return static_cast<Compression>(encoding_to_wire(e)); }

// The head every commit request shares, one table's or many tables': where the commit
// belongs and how its rows are encoded.  Each RPC then names its chunk (set_chunk).
inline void set_commit_head(CommitRequest* head, const CommitPoint& at, Encoding enc) {
  head->set_session(at.session);
  head->set_step(at.step);
  head->set_rank(at.rank);
  head->set_world_size(at.world_size);
  head->set_max_ahead(at.max_ahead);
  head->set_base_step(at.base_step);
  head->set_compression(to_proto(enc));
}

// A commit RPC's chunk: `index` of its shard's `count` chunks.
inline void set_chunk(CommitRequest* head, uint32_t index, uint32_t count) {
  head->set_chunk_index(index);
  head->set_chunk_count(count);
}

// A gradient row the client's encoding cannot carry: refused before anything is sent.
[[noreturn]] inline void refuse_gradient(const EncodeFailure& f, int64_t key, Encoding e,
                                         const std::string& where) {
  throw std::invalid_argument(absl::StrCat("gradient of key ", key, " in ", where, " (row ",
                                           f.index, "): ", describe(e, f.error),
                                           "; nothing was sent"));
}

// Reads n rows of `dim` encoded as `enc` from a reply's values field, row j into out +
// idx[j] * dim (decoded in place; a row split over two slices is staged first).  False at the
// first row that is no valid encoding: *bad_row and *err say which and why.
inline bool read_rows(wire::SliceReader& r, Encoding enc, uint32_t dim, const uint32_t* idx,
                      size_t n, float* out, size_t* bad_row, CodecError* err) {
  const size_t row_bytes = encoded_row_bytes(enc, dim);
  std::vector<uint8_t> staged(enc == Encoding::kNone ? 0 : row_bytes);
  for (size_t j = 0; j < n; ++j) {
    float* dst = out + size_t{idx[j]} * dim;
    if (enc == Encoding::kNone) {
      r.read(dst, row_bytes);
      continue;
    }
    const uint8_t* src = r.contiguous(row_bytes);
    if (src == nullptr) {
      r.read(staged.data(), row_bytes);
      src = staged.data();
    }
    if (!decode_row(enc, src, dim, dst, err)) {
      *bad_row = j;
      return false;
    }
  }
  return true;
}

// The distinct keys of a pull: select() holds the position of each one's first occurrence
// (null: every position, as ShardSplit reads a null selection); copy_duplicates() then gives
// every later occurrence its first occurrence's row.  Keys that are strictly increasing
// (every step pipeline pulls a batch's sorted unique keys) are distinct without a look: one
// pass, no hash map of the whole pull, no list of positions.
class FirstOccurrences {
 public:
  FirstOccurrences(const int64_t* keys, size_t n) {
    if (std::adjacent_find(keys, keys + n, std::greater_equal<int64_t>()) == keys + n) return;
    uid_.resize(n);
    first_.reserve(n);
    absl::flat_hash_map<int64_t, uint32_t> index;
    index.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto [it, inserted] = index.try_emplace(keys[i], static_cast<uint32_t>(first_.size()));
      if (inserted) first_.push_back(static_cast<uint32_t>(i));
      uid_[i] = it->second;
    }
  }
  const std::vector<uint32_t>* select() const { return uid_.empty() ? nullptr : &first_; }
  bool has_duplicates() const { return first_.size() < uid_.size(); }
  // out: `width` values per position.
  template <class T>
  void copy_duplicates(T* out, size_t width) const {
    for (size_t i = 0; i < uid_.size(); ++i) {
      const size_t f = first_[uid_[i]];
      if (f != i) std::memcpy(out + i * width, out + f * width, width * sizeof(T));
    }
  }

 private:
  std::vector<uint32_t> first_;  // with uid_ only
  std::vector<uint32_t> uid_;    // per position: index of its key in first_ (empty: distinct)
};

}  // namespace cpu_dist::ps::client_calls
