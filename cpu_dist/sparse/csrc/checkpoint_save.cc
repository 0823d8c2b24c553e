// Writing a shard checkpoint in pieces: while the table is frozen (no update lands, pulls are
// served), each group of partitions is copied out under the stripe locks and written with no
// lock held, so memory beyond the table is one piece and a pull never waits for the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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

// Writes partitions [lo, hi) as blocks (keys ascending) from `off` on; fills their checksums.
// Returns the end offset.
uint64_t write_piece(const ShardTable& table, uint32_t lo, uint32_t hi, int fd, uint64_t off,
                     FileHeader& h, const std::string& path) {
  std::vector<Place> places;
  uint64_t n = 0;
  for (uint32_t p = lo; p < hi; ++p) n += h.partition_rows[p];
  places.reserve(n);
  table.for_each_key([&](int64_t key) {
    const uint32_t p = partition_of(key);
    if (p >= lo && p < hi) places.push_back(Place{p, key});
  });
  std::sort(places.begin(), places.end());
  const uint32_t dim = table.dim();
  std::vector<char> buf;
  std::vector<int64_t> keys;
  for (size_t i = 0; i < places.size();) {
    const uint32_t p = places[i].partition;
    keys.clear();
    for (; i < places.size() && places[i].partition == p; ++i) keys.push_back(places[i].key);
    const size_t m = keys.size();
    buf.resize(m * (sizeof(int64_t) + (size_t{dim} + 1) * sizeof(float)));
    char* v = buf.data() + m * sizeof(int64_t);
    std::memcpy(buf.data(), keys.data(), m * sizeof(int64_t));
    table.gather(keys.data(), m, v, v + m * dim * sizeof(float));  // under the stripe locks
    h.partition_crc[p] = crc32_of(0, buf.data(), buf.size());
    pwrite_all(fd, buf.data(), buf.size(), off, path);  // no lock held
    off += buf.size();
  }
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
  h.partition_rows.assign(kNumPartitions, 0);
  h.partition_crc.assign(kNumPartitions, 0);
  table.for_each_key([&](int64_t key) { ++h.partition_rows[partition_of(key)]; });
  for (uint64_t r : h.partition_rows) h.fixed.rows += r;
  const uint64_t row_bytes = sizeof(int64_t) + (uint64_t{table.dim()} + 1) * sizeof(float);
  const uint64_t piece_bytes = std::max(kMinPieceBytes, h.fixed.rows * row_bytes / kMaxPieces);
  const std::vector<uint32_t> first = plan_pieces(h.partition_rows, piece_bytes / row_bytes);
  SaveResult res;
  try {
    uint64_t off = header_size(static_cast<uint32_t>(h.table.size()));
    for (size_t i = 0; i + 1 < first.size(); ++i)
      off = write_piece(table, first[i], first[i + 1], f->get(), off, h, tmp);
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
