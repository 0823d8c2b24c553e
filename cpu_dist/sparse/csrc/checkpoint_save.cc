// Writing a shard checkpoint in pieces: while the table is frozen (no update lands, pulls are
// served), worker threads copy groups of partitions out under the stripe locks, and the calling
// thread writes them in order with no lock held (checkpoint_stream.h), so memory beyond the
// table is a few pieces and a pull never waits for the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "checkpoint.h"
#include "checkpoint_io.h"
#include "checkpoint_stream.h"
#include "hashing.h"

namespace cpu_dist::ps::ckpt {

namespace {

using grpc::StatusCode;
namespace fs = std::filesystem;

// Rows are gathered and checksummed in pieces of about this many bytes by worker threads, at
// most kPiecesAhead of them beyond the one being written (so memory beyond the table is that
// many pieces, plus 8 bytes per DRAM row for the key lists).
constexpr double kPieceBytes = 8 << 20;
constexpr size_t kPiecesAhead = 6;

// Creates `dir` and its missing parents, fsyncing each new directory and its parent, so that
// a crash cannot lose an entry the checkpoint depends on.
void create_dirs_synced(const fs::path& dir, const std::string& path) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path())
    missing.push_back(p);
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError(
        StatusCode::FAILED_PRECONDITION,
        absl::StrCat("checkpoint ", path, ": cannot create its directory: ", ec.message()));
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    fsync_dir(*it);
    fsync_dir(it->parent_path());
  }
}

// A temporary name nobody can predict, opened only if it does not exist and is no link.
std::string open_temp(const std::string& path, std::unique_ptr<Fd>* fd) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t r = (static_cast<uint64_t>(rd()) << 32) | rd();
    std::string tmp = absl::StrCat(path, ".tmp-", ::getpid(), "-", absl::Hex(r, absl::kZeroPad16));
    *fd = std::make_unique<Fd>(
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if ((*fd)->get() >= 0) return tmp;
    if (errno != EEXIST) break;
  }
  throw CheckpointError(
      StatusCode::FAILED_PRECONDITION,
      absl::StrCat("checkpoint ", path, ": cannot create a temporary file: ", errno_text()));
}

// Consecutive partition ranges [first[i], first[i + 1]) of about piece_rows rows each.
std::vector<uint32_t> plan_pieces(const std::vector<double>& rows, double piece_rows) {
  std::vector<uint32_t> first{0};
  double in_piece = 0;
  for (uint32_t p = 0; p < kNumPartitions; ++p) {
    if (in_piece > 0 && in_piece + rows[p] > piece_rows) {
      first.push_back(p);
      in_piece = 0;
    }
    in_piece += rows[p];
  }
  first.push_back(kNumPartitions);
  return first;
}

// Counts of keys without a row, in file order (partition, key).
struct PendingRow {
  uint32_t partition;
  int64_t key, count, last_seen;
};

// An append-only byte buffer, not zero-filled (a piece is written over once).
class Bytes {
 public:
  char* extend(size_t n) {
    if (size_ + n > cap_) reserve(std::max(size_ + n, cap_ * 2));
    char* out = p_.get() + size_;
    size_ += n;
    return out;
  }
  void reserve(size_t cap) {
    if (cap <= cap_) return;
    std::unique_ptr<char, FreeBytes> q(static_cast<char*>(std::malloc(cap)));
    if (q == nullptr) throw std::bad_alloc();
    if (size_ > 0) std::memcpy(q.get(), p_.get(), size_);
    p_ = std::move(q);
    cap_ = cap;
  }
  const char* data() const { return p_.get(); }
  size_t size() const { return size_; }

 private:
  struct FreeBytes {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeBytes> p_;
  size_t size_ = 0, cap_ = 0;
};

// What the save knows of one table before the pieces are built: the DRAM keys bucketed by
// the table's partition (one pass over the index instead of one per piece) and the counts,
// sorted.
struct SavePlan {
  const ShardTable* table = nullptr;
  uint32_t state_floats = 1;
  std::vector<uint64_t> key_start;    // kNumPartitions + 1 offsets into keys
  std::vector<int64_t> keys;          // DRAM keys, partition by partition (sorted per piece)
  std::vector<PendingRow> pending;    // sorted by (partition, key)
  std::vector<size_t> pending_start;  // kNumPartitions + 1 offsets into pending
  std::vector<uint32_t> first;        // pieces: partitions [first[i], first[i + 1])
};

// Appends partition p's block (checkpoint_format.h, version 3) of one table to out, merging
// the DRAM rows (read under the stripe locks) with the SSD tier's from `cur` (a range scan in
// the file's own order; where a row is in both, DRAM's is the current one).  Sets the
// partition's counts and checksum in h.
void append_block(const SavePlan& plan, uint32_t p, const int64_t* dkeys, size_t dn,
                  const PendingRow* pend, size_t m, TierStore::Cursor* cur, Bytes& out,
                  TableHeader& h) {
  const ShardTable& table = *plan.table;
  const uint32_t dim = table.dim();
  const size_t sf = plan.state_floats;
  const size_t start = out.size();
  size_t n = dn;
  if (cur == nullptr || !cur->valid() || cur->partition() != p) {
    // DRAM rows only: read straight into the block's places.
    char* b = out.extend(dn * block_row_bytes(dim, plan.state_floats, kFormatVersion));
    if (dn > 0) std::memcpy(b, dkeys, dn * sizeof(int64_t));
    char* values = b + dn * sizeof(int64_t);
    char* state = values + dn * dim * sizeof(float);
    char* steps = state + dn * sf * sizeof(float);
    if (dn > 0) table.read(dkeys, dn, values, state, steps);
  } else {
    std::vector<float> dvalues(dn * dim), dstate(dn * sf);
    std::vector<int64_t> dsteps(dn);
    if (dn > 0) table.read(dkeys, dn, dvalues.data(), dstate.data(), dsteps.data());
    std::vector<int64_t> keys, steps;
    std::vector<float> values, state;
    size_t d = 0;
    const auto take_dram = [&] {
      keys.push_back(dkeys[d]);
      values.insert(values.end(), &dvalues[d * dim], &dvalues[d * dim] + dim);
      state.insert(state.end(), &dstate[d * sf], &dstate[d * sf] + sf);
      steps.push_back(dsteps[d]);
      ++d;
    };
    for (; cur->valid() && cur->partition() == p; cur->next()) {
      const int64_t k = cur->key();
      while (d < dn && dkeys[d] < k) take_dram();
      if (d < dn && dkeys[d] == k) {
        take_dram();  // the DRAM row; the SSD copy may be stale
        continue;
      }
      keys.push_back(k);
      values.resize(values.size() + dim);
      state.resize(state.size() + sf);
      steps.emplace_back();
      table.ssd_decode(cur->value(), &values[values.size() - dim], &state[state.size() - sf],
                       &steps.back());
    }
    while (d < dn) take_dram();
    n = keys.size();
    const auto put = [&out](const void* src, size_t len) {
      if (len > 0) std::memcpy(out.extend(len), src, len);
    };
    put(keys.data(), n * sizeof(int64_t));
    put(values.data(), values.size() * sizeof(float));
    put(state.data(), state.size() * sizeof(float));
    put(steps.data(), n * sizeof(int64_t));
  }
  if (m > 0) {
    char* q = out.extend(m * kPendingBytes);
    for (size_t j = 0; j < m; ++j, q += sizeof(int64_t)) std::memcpy(q, &pend[j].key, 8);
    for (size_t j = 0; j < m; ++j, q += sizeof(int64_t)) std::memcpy(q, &pend[j].count, 8);
    for (size_t j = 0; j < m; ++j, q += sizeof(int64_t)) std::memcpy(q, &pend[j].last_seen, 8);
  }
  h.partition_rows[p] = n;
  h.partition_pending[p] = m;
  h.partition_crc[p] = n + m > 0 ? crc32_of(0, out.data() + start, out.size() - start) : 0;
}

// Piece i of a table's plan: its partitions' blocks, one after the other.
Bytes build_piece(SavePlan& plan, size_t i, TableHeader& h) {
  const ShardTable& table = *plan.table;
  const uint32_t lo = plan.first[i], hi = plan.first[i + 1];
  // Each piece sorts its own keys (the workers share the sorting).
  for (uint32_t p = lo; p < hi; ++p)
    std::sort(plan.keys.begin() + plan.key_start[p], plan.keys.begin() + plan.key_start[p + 1]);
  // After the DRAM keys were listed: a row evicted since is on SSD by then (table.h).
  std::unique_ptr<TierStore::Cursor> cur = table.ssd_cursor(hi, true);
  if (cur) cur->seek(lo, false, 0);
  Bytes out;
  const size_t rows = plan.key_start[hi] - plan.key_start[lo];
  out.reserve(rows * block_row_bytes(table.dim(), plan.state_floats, kFormatVersion) +
              (plan.pending_start[hi] - plan.pending_start[lo]) * kPendingBytes);
  for (uint32_t p = lo; p < hi; ++p)
    append_block(plan, p, plan.keys.data() + plan.key_start[p],
                 plan.key_start[p + 1] - plan.key_start[p],
                 plan.pending.data() + plan.pending_start[p],
                 plan.pending_start[p + 1] - plan.pending_start[p], cur.get(), out, h);
  return out;
}

SavePlan plan_save(const ShardTable& table, uint64_t salt, uint32_t state_floats,
                   uint64_t ssd_rows) {
  SavePlan plan;
  plan.table = &table;
  plan.state_floats = state_floats;
  std::vector<uint64_t> count(kNumPartitions + 1, 0);
  table.for_each_key([&](int64_t key) { ++count[partition_of(key, salt) + 1]; });
  plan.key_start.assign(kNumPartitions + 1, 0);
  for (uint32_t p = 0; p < kNumPartitions; ++p)
    plan.key_start[p + 1] = plan.key_start[p] + count[p + 1];
  const uint64_t dram_rows = plan.key_start[kNumPartitions];
  plan.keys.resize(dram_rows);
  std::vector<uint64_t> at(plan.key_start.begin(), plan.key_start.end() - 1);
  // The table is frozen: no row is created meanwhile, but one may be evicted (and listed on
  // SSD later); never write past a partition's count.
  table.for_each_key([&](int64_t key) {
    const uint32_t p = partition_of(key, salt);
    if (at[p] < plan.key_start[p + 1]) plan.keys[at[p]++] = key;
  });
  for (uint32_t p = 0; p < kNumPartitions; ++p) {  // (only if a row left DRAM in between)
    if (at[p] == plan.key_start[p + 1]) continue;
    plan.keys.erase(plan.keys.begin() + at[p], plan.keys.begin() + plan.key_start[p + 1]);
    const uint64_t gap = plan.key_start[p + 1] - at[p];
    for (uint32_t q = p + 1; q <= kNumPartitions; ++q) plan.key_start[q] -= gap;
    for (uint32_t q = p + 1; q < kNumPartitions; ++q) at[q] -= gap;
  }
  table.for_each_pending([&](int64_t key, int64_t c, int64_t last_seen) {
    plan.pending.push_back(PendingRow{partition_of(key, salt), key, c, last_seen});
  });
  std::sort(plan.pending.begin(), plan.pending.end(), [](const PendingRow& a, const PendingRow& b) {
    return a.partition != b.partition ? a.partition < b.partition : a.key < b.key;
  });
  plan.pending_start.assign(kNumPartitions + 1, 0);
  for (const PendingRow& r : plan.pending) ++plan.pending_start[r.partition + 1];
  for (uint32_t p = 0; p < kNumPartitions; ++p) plan.pending_start[p + 1] += plan.pending_start[p];
  // Pieces of about kPieceBytes, the SSD rows assumed spread like the DRAM rows.
  const double scale = dram_rows > 0 ? 1.0 + static_cast<double>(ssd_rows) / dram_rows : 1.0;
  std::vector<double> weight(kNumPartitions);
  for (uint32_t p = 0; p < kNumPartitions; ++p)
    weight[p] = dram_rows > 0 ? scale * (plan.key_start[p + 1] - plan.key_start[p])
                              : static_cast<double>(ssd_rows) / kNumPartitions;
  const double row_bytes =
      static_cast<double>(block_row_bytes(table.dim(), state_floats, kFormatVersion));
  plan.first = plan_pieces(weight, std::max(1.0, kPieceBytes / row_bytes));
  return plan;
}

}  // namespace

SaveResult save_shard(const std::vector<TableToSave>& tables, const ShardMeta& meta,
                      const std::string& path) {
  const fs::path target(path);
  if (target.has_parent_path()) create_dirs_synced(target.parent_path(), path);
  std::unique_ptr<Fd> f;
  const std::string tmp = open_temp(path, &f);
  FileHeader h;
  h.fixed.format_version = kFormatVersion;
  h.fixed.shard_index = meta.shard_index;
  h.fixed.num_shards = meta.num_shards;
  h.fixed.step = meta.step;
  std::vector<SavePlan> plans;
  // pieces[k] = (table, piece of that table's plan), table by table
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableToSave& ts = tables[t];
    TableHeader th;
    th.fixed = ts.spec;
    th.fixed.salt = table_salt(ts.name);
    th.name = ts.name;
    th.partition_rows.assign(kNumPartitions, 0);
    th.partition_pending.assign(kNumPartitions, 0);
    th.partition_crc.assign(kNumPartitions, 0);
    h.tables.push_back(std::move(th));
    plans.push_back(plan_save(*ts.table, table_salt(ts.name), ts.spec.state_floats,
                              ts.table->tier_stats().rows_ssd));
    for (size_t i = 0; i + 1 < plans.back().first.size(); ++i) pieces.emplace_back(t, i);
  }
  SaveResult res;
  try {
    DirectWriter out(tmp, header_size(h));
    {
      // Workers gather and checksum the next pieces while this thread writes one.
      OrderedPipeline<Bytes> pipeline(pieces.size(), checkpoint_threads(), kPiecesAhead,
                                      [&](size_t k) {
                                        const auto [t, i] = pieces[k];
                                        return build_piece(plans[t], i, h.tables[t]);
                                      });
      for (size_t k = 0; k < pieces.size(); ++k) {
        const Bytes piece = pipeline.next();
        out.append(piece.data(), piece.size());
      }
    }
    const uint64_t off = out.finish();
    res.bytes = off;
    const std::string head = encode_header(h);
    pwrite_all(f->get(), head.data(), head.size(), 0, tmp);
    if (::fsync(f->get()) != 0 || f->close() != 0)
      throw CheckpointError(StatusCode::INTERNAL,
                            absl::StrCat("checkpoint ", tmp, ": flush failed: ", errno_text()));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw CheckpointError(StatusCode::INTERNAL,
                            absl::StrCat("checkpoint ", path, ": rename failed: ", errno_text()));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(target.has_parent_path() ? target.parent_path() : fs::path("."));
  res.rows = h.fixed.rows;
  res.checksum = h.header_crc;
  return res;
}

}  // namespace cpu_dist::ps::ckpt
