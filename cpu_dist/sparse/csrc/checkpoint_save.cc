// Writing a shard checkpoint in pieces: while the table is frozen (no update lands, pulls are
// served), each group of partitions is copied out under the stripe locks and written with no
// lock held, so memory beyond the table is one piece and a pull never waits for the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "checkpoint.h"
#include "checkpoint_io.h"
#include "hashing.h"

namespace cpu_dist::ps::ckpt {

namespace {

using grpc::StatusCode;
namespace fs = std::filesystem;

// A piece is at least this big, and there are at most kMaxPieces of them: each piece costs
// one pass over the table's index.
constexpr uint64_t kMinPieceBytes = 64ull << 20;
constexpr uint64_t kMaxPieces = 32;

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
std::vector<uint32_t> plan_pieces(const std::vector<uint64_t>& rows, uint64_t piece_rows) {
  std::vector<uint32_t> first{0};
  uint64_t in_piece = 0;
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

struct Place {
  uint32_t partition;
  int64_t key;
  bool operator<(const Place& o) const {
    return partition != o.partition ? partition < o.partition : key < o.key;
  }
};

// Counts of keys without a row, in file order (partition, key).
struct PendingRow {
  uint32_t partition;
  int64_t key, count, last_seen;
};

// One partition's block as it is assembled (checkpoint_format.h, version 2).
struct Block {
  std::vector<int64_t> keys, steps;
  std::vector<float> values, state;
  std::vector<char> bytes;

  void clear() {
    keys.clear();
    steps.clear();
    values.clear();
    state.clear();
  }
  // The block's bytes, counts after the rows.
  const std::vector<char>& assemble(const PendingRow* pend, size_t m) {
    const size_t n = keys.size();
    bytes.resize(n * sizeof(int64_t) + (values.size() + state.size()) * sizeof(float) +
                 n * sizeof(int64_t) + m * kPendingBytes);
    char* p = bytes.data();
    const auto put = [&p](const void* src, size_t len) {
      if (len > 0) std::memcpy(p, src, len);
      p += len;
    };
    put(keys.data(), n * sizeof(int64_t));
    put(values.data(), values.size() * sizeof(float));
    put(state.data(), n * sizeof(float));
    put(steps.data(), n * sizeof(int64_t));
    for (size_t j = 0; j < m; ++j) put(&pend[j].key, sizeof(int64_t));
    for (size_t j = 0; j < m; ++j) put(&pend[j].count, sizeof(int64_t));
    for (size_t j = 0; j < m; ++j) put(&pend[j].last_seen, sizeof(int64_t));
    return bytes;
  }
};

// Writes partitions [lo, hi) as blocks from `off` on, merging the DRAM rows (read under the
// stripe locks) with the SSD tier's (a range scan in the file's own order; where a row is in
// both, DRAM's is the current one); fills their counts and checksums.  Returns the end offset.
uint64_t write_piece(const ShardTable& table, uint32_t lo, uint32_t hi,
                     const std::vector<PendingRow>& pending, size_t* next_pending, int fd,
                     uint64_t off, FileHeader& h, const std::string& path) {
  std::vector<Place> places;
  uint64_t n = 0;
  for (uint32_t p = lo; p < hi; ++p) n += h.partition_rows[p];
  places.reserve(n);
  table.for_each_key([&](int64_t key) {
    const uint32_t p = partition_of(key);
    if (p >= lo && p < hi) places.push_back(Place{p, key});
  });
  std::sort(places.begin(), places.end());
  // After the DRAM keys: a row evicted meanwhile is on SSD by then (table.h).
  std::unique_ptr<TierStore::Cursor> cur = table.ssd_cursor(hi, true);
  if (cur) cur->seek(lo, false, 0);
  const uint32_t dim = table.dim();
  Block blk;
  std::vector<int64_t> dkeys, dsteps;
  std::vector<float> dvalues, dstate;
  size_t i = 0, pi = *next_pending;
  for (uint32_t p = lo; p < hi; ++p) {
    dkeys.clear();
    for (; i < places.size() && places[i].partition == p; ++i) dkeys.push_back(places[i].key);
    const size_t dn = dkeys.size();
    dvalues.resize(dn * dim);
    dstate.resize(dn);
    dsteps.resize(dn);
    if (dn > 0) table.read(dkeys.data(), dn, dvalues.data(), dstate.data(), dsteps.data());
    blk.clear();
    size_t d = 0;
    const auto take_dram = [&] {
      blk.keys.push_back(dkeys[d]);
      blk.values.insert(blk.values.end(), &dvalues[d * dim], &dvalues[d * dim] + dim);
      blk.state.push_back(dstate[d]);
      blk.steps.push_back(dsteps[d]);
      ++d;
    };
    for (; cur && cur->valid() && cur->partition() == p; cur->next()) {
      const int64_t k = cur->key();
      while (d < dn && dkeys[d] < k) take_dram();
      if (d < dn && dkeys[d] == k) {
        take_dram();  // the DRAM row; the SSD copy may be stale
        continue;
      }
      blk.keys.push_back(k);
      blk.values.resize(blk.values.size() + dim);
      float state;
      int64_t step;
      table.ssd_decode(cur->value(), &blk.values[blk.values.size() - dim], &state, &step);
      blk.state.push_back(state);
      blk.steps.push_back(step);
    }
    while (d < dn) take_dram();
    const size_t first_pending = pi;
    while (pi < pending.size() && pending[pi].partition == p) ++pi;
    const size_t m = pi - first_pending;
    h.partition_rows[p] = blk.keys.size();
    h.partition_pending[p] = m;
    if (blk.keys.empty() && m == 0) continue;
    const std::vector<char>& bytes = blk.assemble(pending.data() + first_pending, m);
    h.partition_crc[p] = crc32_of(0, bytes.data(), bytes.size());
    pwrite_all(fd, bytes.data(), bytes.size(), off, path);  // no lock held
    off += bytes.size();
  }
  *next_pending = pi;
  return off;
}

}  // namespace

SaveResult save_shard(const ShardTable& table, const ShardTable::Frozen&, const ShardMeta& meta,
                      const std::string& path) {
  const fs::path target(path);
  if (target.has_parent_path()) create_dirs_synced(target.parent_path(), path);
  std::unique_ptr<Fd> f;
  const std::string tmp = open_temp(path, &f);
  FileHeader h;
  h.fixed.dim = table.dim();
  h.fixed.shard_index = meta.shard_index;
  h.fixed.num_shards = meta.num_shards;
  h.fixed.step = meta.step;
  h.table = meta.table;
  // DRAM rows per partition first (they plan the pieces); write_piece sets the final counts.
  h.partition_rows.assign(kNumPartitions, 0);
  h.partition_pending.assign(kNumPartitions, 0);
  h.partition_crc.assign(kNumPartitions, 0);
  uint64_t dram_rows = 0;
  table.for_each_key([&](int64_t key) { ++h.partition_rows[partition_of(key)]; });
  for (uint64_t r : h.partition_rows) dram_rows += r;
  std::vector<PendingRow> pending;
  table.for_each_pending([&](int64_t key, int64_t count, int64_t last_seen) {
    pending.push_back(PendingRow{partition_of(key), key, count, last_seen});
  });
  std::sort(pending.begin(), pending.end(), [](const PendingRow& a, const PendingRow& b) {
    return a.partition != b.partition ? a.partition < b.partition : a.key < b.key;
  });
  const uint64_t row_bytes = block_row_bytes(table.dim(), kFormatVersion);
  const uint64_t piece_bytes = std::max(kMinPieceBytes, dram_rows * row_bytes / kMaxPieces);
  const std::vector<uint32_t> first = plan_pieces(h.partition_rows, piece_bytes / row_bytes);
  SaveResult res;
  try {
    uint64_t off = header_size(static_cast<uint32_t>(h.table.size()));
    size_t next_pending = 0;
    for (size_t i = 0; i + 1 < first.size(); ++i)
      off =
          write_piece(table, first[i], first[i + 1], pending, &next_pending, f->get(), off, h, tmp);
    res.bytes = off;
    for (uint64_t r : h.partition_rows) h.fixed.rows += r;
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
