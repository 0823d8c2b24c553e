// Reading a shard checkpoint for a load; the writer is checkpoint_save.cc.
#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "checkpoint_io.h"
#include "checkpoint_stream.h"
#include "hashing.h"
#include "optimizer.h"

namespace cpu_dist::ps::ckpt {

using grpc::StatusCode;

namespace {

// One table's part of one opened file.
struct FileTable {
  std::vector<uint64_t> rows;     // per partition
  std::vector<uint64_t> pending;  // per partition: counts of keys without a row (version >= 2)
  std::vector<uint32_t> crcs;     // per partition
  std::vector<uint64_t> offset;   // per partition: where its block starts
};

// One shard file whose header has been read and checked.
struct OpenedFile {
  uint32_t version = kFormatVersion;
  int64_t step = -1;
  std::vector<TableHeader> tables;  // the header's (partition arrays moved into `parts`)
  std::vector<FileTable> parts;     // per table
};

// Errors about one file: "checkpoint PATH: what".
struct FileErrors {
  std::string prefix;
  CheckpointError operator()(StatusCode code, const std::string& what) const {
    return CheckpointError(code, prefix + what);
  }
};

// Reads a file's header and checks what the header alone can tell: magic, version, lengths,
// its checksum, and (with a manifest) that it is the manifest's file.
DecodedHeader read_header(int fd, uint64_t size, const FileSpec& spec, const FileErrors& fail) {
  DecodedHeader d;
  try {
    d = decode_header(
        [fd](uint64_t off, void* out, size_t n) { return pread_all(fd, out, n, off); });
  } catch (const HeaderError& e) {
    switch (e.kind) {
      case HeaderError::kTruncated:
        throw fail(StatusCode::DATA_LOSS,
                   absl::StrCat("truncated (", size, " bytes, shorter than its header)"));
      case HeaderError::kBadMagic:
        throw fail(StatusCode::DATA_LOSS, "not a cpu_dist PS checkpoint file (bad magic)");
      case HeaderError::kVersion:
        throw fail(StatusCode::FAILED_PRECONDITION,
                   absl::StrCat("format version ", e.version, ", this build reads versions ",
                                kOldestFormatVersion, " to ", kFormatVersion));
      case HeaderError::kCorrupt: throw fail(StatusCode::DATA_LOSS, "corrupt header");
    }
  }
  const uint32_t stored = d.header.header_crc;
  if (stored != d.actual_crc)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("corrupt header (crc32 ", d.actual_crc, ", stored ", stored, ")"));
  if (spec.bytes != 0 && stored != spec.checksum)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("header checksum ", stored, " is not the manifest's ", spec.checksum,
                            " (a file of another checkpoint?)"));
  return d;
}

OpenedFile open_checked(const FileSpec& spec) {
  const FileErrors fail{absl::StrCat("checkpoint ", spec.path, ": ")};
  Fd file(::open(spec.path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = file.get();
  if (fd < 0)
    throw fail(errno == ENOENT ? StatusCode::NOT_FOUND : StatusCode::FAILED_PRECONDITION,
               errno == ENOENT ? "missing" : absl::StrCat("cannot open: ", errno_text()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw fail(StatusCode::INTERNAL, "cannot stat");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (spec.bytes != 0 && size != spec.bytes)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat(size < spec.bytes ? "truncated" : "too long", " (", size,
                            " bytes, the manifest says ", spec.bytes, ")"));
  DecodedHeader d = read_header(fd, size, spec, fail);
  OpenedFile of;
  of.version = d.header.fixed.format_version;
  of.step = d.header.fixed.step;
  uint64_t total = 0, off = d.bytes;
  for (TableHeader& t : d.header.tables) {
    // A version 3 table's spec is what its blocks' layout follows from: checked before any
    // length is computed from it.
    if (of.version >= 3 &&
        (t.fixed.salt != table_salt(t.name) || t.fixed.dim == 0 ||
         t.fixed.optimizer > static_cast<uint32_t>(OptimizerKind::kAdagrad) ||
         t.fixed.state_floats !=
             state_floats(static_cast<OptimizerKind>(t.fixed.optimizer), t.fixed.dim)))
      throw fail(StatusCode::DATA_LOSS, "corrupt header");
    if (of.version >= 3 && !of.tables.empty() && !(of.tables.back().name < t.name))
      throw fail(StatusCode::DATA_LOSS, "corrupt header (tables not in name order)");
    FileTable ft;
    ft.rows = std::move(t.partition_rows);
    ft.pending = std::move(t.partition_pending);
    ft.crcs = std::move(t.partition_crc);
    ft.offset.resize(kNumPartitions);
    const uint64_t row_bytes = block_row_bytes(t.fixed.dim, t.fixed.state_floats, of.version);
    uint64_t rows = 0;
    for (uint32_t p = 0; p < kNumPartitions; ++p) {
      if (ft.rows[p] > size / row_bytes || ft.pending[p] > size / kPendingBytes)
        throw fail(StatusCode::DATA_LOSS, "corrupt header");
      ft.offset[p] = off;
      off += ft.rows[p] * row_bytes + ft.pending[p] * kPendingBytes;
      rows += ft.rows[p];
    }
    if (of.version >= 3 && rows != t.fixed.rows)
      throw fail(StatusCode::DATA_LOSS, "corrupt header");
    total += rows;
    of.parts.push_back(std::move(ft));
    of.tables.push_back(std::move(t));
  }
  if (total != d.header.fixed.rows || off != size)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("truncated or corrupt (", size, " bytes; the header's ",
                            d.header.fixed.rows, " rows need ", off, ")"));
  return of;
}

// The field in which two files' headers of one table differ ("" when none): every file of a
// checkpoint holds the same tables with the same spec.
std::string differing_field(const TableFixed& a, const TableFixed& b) {
  if (a.dim != b.dim) return "dim";
  if (a.optimizer != b.optimizer) return "optimizer";
  if (a.state_floats != b.state_floats) return "state width";
  if (std::memcmp(&a.init_scale, &b.init_scale, sizeof(float)) != 0) return "init_scale";
  if (std::memcmp(&a.eps, &b.eps, sizeof(float)) != 0) return "eps";
  if (a.admit_after != b.admit_after) return "admit_after";
  if (a.expire_after != b.expire_after) return "expire_after";
  if (a.seed != b.seed) return "seed";
  if (a.num_embeddings != b.num_embeddings) return "num_embeddings";
  if (a.flags != b.flags) return "flags";
  return "";
}

}  // namespace

namespace {

// A partition's block: where its parts start (see checkpoint_format.h).
struct BlockView {
  const int64_t* keys;  // aligned (a copy where the block's are not)
  const float* values;
  const float* state;
  const char* steps;    // int64[n], maybe unaligned; null in version 1
  const char* pending;  // int64 keys[m], counts[m], last_seen[m], maybe unaligned
  size_t n, m;
};

// The shape of one table's blocks.
struct BlockShape {
  uint32_t dim, state_floats, version;
  uint64_t salt;
};

BlockView view_block(const char* b, size_t n, size_t m, const BlockShape& sh) {
  BlockView v{};
  v.n = n;
  v.m = m;
  v.keys = reinterpret_cast<const int64_t*>(b);
  v.values = reinterpret_cast<const float*>(b + n * sizeof(int64_t));
  v.state = v.values + n * sh.dim;
  const char* after =
      b + n * (sizeof(int64_t) + (size_t{sh.dim} + sh.state_floats) * sizeof(float));
  v.steps = sh.version >= 2 ? after : nullptr;
  v.pending = sh.version >= 2 ? after + n * sizeof(int64_t) : nullptr;
  return v;
}

int64_t load_i64(const char* p, size_t i) {
  int64_t v;
  std::memcpy(&v, p + i * sizeof(v), sizeof(v));
  return v;
}

// Keys of partition p, ascending (so no key twice); `what`: "keys" or "counted keys";
// `where`: "checkpoint PATH: table 'NAME': ", which every message starts with.
template <class Get>
void check_keys(Get key, size_t n, uint32_t p, uint64_t salt, const char* what,
                const std::string& where) {
  for (size_t j = 0; j < n; ++j) {
    const int64_t k = key(j);
    if (partition_of(k, salt) != p)
      throw CheckpointError(StatusCode::DATA_LOSS,
                            absl::StrCat(where, "key ", k, " stored in partition ", p));
    if (j > 0 && k <= key(j - 1))
      throw CheckpointError(StatusCode::DATA_LOSS,
                            absl::StrCat(where, what, " of partition ", p, " are not ascending"));
  }
}

// A partition's block as read into memory.  Checks its checksum, and that its keys and its
// counted keys belong to it, ascending.
void check_block(const char* block, const BlockView& v, uint32_t p, uint64_t salt,
                 uint32_t expected_crc, size_t len, const std::string& where) {
  const uint32_t got = crc32_of(0, block, len);
  if (got != expected_crc)
    throw CheckpointError(StatusCode::DATA_LOSS,
                          absl::StrCat(where, "partition ", p, " is corrupt (crc32 ", got,
                                       ", header says ", expected_crc, ")"));
  check_keys([&](size_t j) { return v.keys[j]; }, v.n, p, salt, "keys", where);
  if (v.m > 0)
    check_keys([&](size_t j) { return load_i64(v.pending, j); }, v.m, p, salt, "counted keys",
               where);
}

// Blocks read together: consecutive owned blocks of one file, about kChunkBytes at a time.
constexpr uint64_t kChunkBytes = 8 << 20;
constexpr size_t kChunksAhead = 6;

struct BlockSpec {
  uint32_t p;
  uint64_t off, len;
};
struct ChunkSpec {
  int file;
  std::vector<BlockSpec> blocks;
};

// A chunk read and checked: its blocks' views, each 8-byte aligned (a block that is not sits
// copied in `moved`).
struct Chunk {
  AlignedBytes bytes;
  std::vector<AlignedBytes> moved;
  std::vector<std::pair<uint32_t, BlockView>> blocks;
};

Chunk read_chunk(const ChunkSpec& spec, const FileTable& ft, const BlockShape& sh, int fd,
                 bool direct, const std::string& path, const std::string& table) {
  const std::string where = absl::StrCat("checkpoint ", path, ": table '", table, "': ");
  Chunk c;
  const uint64_t off = spec.blocks.front().off;
  const uint64_t len = spec.blocks.back().off + spec.blocks.back().len - off;
  const int64_t at = read_range(fd, direct, off, len, c.bytes, path);
  if (at < 0)
    throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path, ": truncated"));
  const auto moved = [&c](const char* from, size_t len) {
    c.moved.emplace_back();
    c.moved.back().reserve(len);
    std::memcpy(c.moved.back().data(), from, len);
    return c.moved.back().data();
  };
  for (const BlockSpec& b : spec.blocks) {
    const char* block = c.bytes.data() + at + (b.off - off);
    // A row of dim 64 takes 4 mod 8 bytes, so about half the blocks start 4 bytes off: then
    // only their keys are copied (the floats are 4-byte aligned in place); a block off by
    // less, whole.
    if (reinterpret_cast<uintptr_t>(block) % alignof(float) != 0) block = moved(block, b.len);
    BlockView v = view_block(block, ft.rows[b.p], ft.pending[b.p], sh);
    if (reinterpret_cast<uintptr_t>(block) % alignof(int64_t) != 0)
      v.keys = reinterpret_cast<const int64_t*>(moved(block, v.n * sizeof(int64_t)));
    check_block(block, v, b.p, sh.salt, ft.crcs[b.p], b.len, where);
    c.blocks.emplace_back(b.p, v);
  }
  return c;
}

}  // namespace

struct CheckpointFiles::Impl {
  std::vector<FileSpec> files;
  uint32_t shard_index = 0, num_shards = 1;
  std::vector<OpenedFile> opened;
  // owner[t][p]: the file that holds partition p of table t this shard owns (-1: none)
  std::vector<std::vector<int>> owner;
  std::vector<size_t> rows;  // per table: owned rows in all
};

CheckpointFiles::CheckpointFiles(std::vector<FileSpec> files, uint32_t shard_index,
                                 uint32_t num_shards)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (files.empty()) throw CheckpointError(StatusCode::INVALID_ARGUMENT, "no checkpoint files");
  if (num_shards == 0 || shard_index >= num_shards)
    throw CheckpointError(StatusCode::INVALID_ARGUMENT, "bad shard index");
  m.files = std::move(files);
  m.shard_index = shard_index;
  m.num_shards = num_shards;
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    m.opened.push_back(open_checked(m.files[fi]));
    const OpenedFile& of = m.opened.back();
    const std::string& path = m.files[fi].path;
    if (of.version < 3 && table_salt(of.tables[0].name) != 0)
      throw CheckpointError(
          StatusCode::FAILED_PRECONDITION,
          absl::StrCat("checkpoint ", path, ": a format version ", of.version, " file of table '",
                       of.tables[0].name,
                       "', whose keys were partitioned before tables had "
                       "their own hash: only the default table '",
                       std::string(kDefaultTable), "' loads from formats 1 and 2"));
    if (fi == 0) {
      m.owner.assign(of.tables.size(), std::vector<int>(kNumPartitions, -1));
      m.rows.assign(of.tables.size(), 0);
    } else {
      const OpenedFile& first = m.opened[0];
      const std::string& first_path = m.files[0].path;
      const auto refuse = [&](const std::string& what) {
        return CheckpointError(StatusCode::INVALID_ARGUMENT,
                               absl::StrCat("checkpoint ", path, ": ", what));
      };
      if (of.step != first.step)
        throw refuse(
            absl::StrCat("holds step ", of.step, ", ", first_path, " holds step ", first.step));
      if (of.version != first.version)
        throw refuse(absl::StrCat("format version ", of.version, ", ", first_path, " is version ",
                                  first.version));
      for (size_t t = 0; t < std::max(of.tables.size(), first.tables.size()); ++t) {
        if (t >= of.tables.size() || t >= first.tables.size() ||
            of.tables[t].name != first.tables[t].name)
          throw refuse(absl::StrCat("holds table '", t < of.tables.size() ? of.tables[t].name : "",
                                    "' where ", first_path, " holds '",
                                    t < first.tables.size() ? first.tables[t].name : "",
                                    "' (files of different checkpoints?)"));
        const std::string field = differing_field(of.tables[t].fixed, first.tables[t].fixed);
        if (!field.empty())
          throw refuse(absl::StrCat("table '", of.tables[t].name, "' has another ", field,
                                    " than in ", first_path));
      }
    }
    for (size_t t = 0; t < of.tables.size(); ++t) {
      const FileTable& ft = of.parts[t];
      for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
        if (ft.rows[p] == 0 && ft.pending[p] == 0) continue;
        int& owner = m.owner[t][p];
        if (owner >= 0)
          throw CheckpointError(
              StatusCode::INVALID_ARGUMENT,
              absl::StrCat("checkpoint ", path, ": partition ", p, " of table '", of.tables[t].name,
                           "' is also in ", m.files[owner].path));
        owner = static_cast<int>(fi);
        m.rows[t] += ft.rows[p];
      }
    }
  }
}

CheckpointFiles::~CheckpointFiles() = default;

uint32_t CheckpointFiles::version() const { return impl_->opened[0].version; }
int64_t CheckpointFiles::step() const { return impl_->opened[0].step; }
const std::vector<TableHeader>& CheckpointFiles::tables() const { return impl_->opened[0].tables; }
const std::string& CheckpointFiles::first_path() const { return impl_->files[0].path; }

StagedTable CheckpointFiles::stage(size_t t, ShardTable& into) const {
  const Impl& m = *impl_;
  const TableHeader& th = m.opened[0].tables.at(t);
  const BlockShape sh{th.fixed.dim, th.fixed.state_floats, m.opened[0].version,
                      m.opened[0].version >= 3 ? th.fixed.salt : 0};
  if (into.dim() != sh.dim)
    throw CheckpointError(
        StatusCode::INVALID_ARGUMENT,
        absl::StrCat("checkpoint ", m.files[0].path, ": table '", th.name, "' has rows of dim ",
                     sh.dim, ", the table's dim is ", into.dim()));
  // Chunks: consecutive owned blocks of one file, about kChunkBytes each.
  std::vector<ChunkSpec> chunks;
  uint64_t in_chunk = 0, end = 0;
  for (uint32_t p = m.shard_index; p < kNumPartitions; p += m.num_shards) {
    const int fi = m.owner[t][p];
    if (fi < 0) continue;
    const FileTable& ft = m.opened[fi].parts[t];
    const uint64_t len = ft.rows[p] * block_row_bytes(sh.dim, sh.state_floats, sh.version) +
                         ft.pending[p] * kPendingBytes;
    const bool joins = !chunks.empty() && chunks.back().file == fi && end == ft.offset[p] &&
                       in_chunk + len <= kChunkBytes;
    if (!joins) {
      chunks.push_back(ChunkSpec{fi, {}});
      in_chunk = 0;
    }
    chunks.back().blocks.push_back(BlockSpec{p, ft.offset[p], len});
    in_chunk += len;
    end = ft.offset[p] + len;
  }
  StagedTable out;
  out.table = &into;
  out.staged = into.new_staged(m.rows[t], checkpoint_threads());
  // Pass 2: the owned partition blocks, read (O_DIRECT where possible) and checked by worker
  // threads a few chunks ahead, staged by this thread in partition order.
  std::vector<std::unique_ptr<Fd>> fds(m.files.size());
  std::vector<bool> direct(m.files.size(), false);
  for (const ChunkSpec& c : chunks) {
    if (fds[c.file]) continue;
    bool d = false;
    const std::string& path = m.files[c.file].path;
    fds[c.file] = std::make_unique<Fd>(open_maybe_direct(path, O_RDONLY, &d));
    if (fds[c.file]->get() < 0)
      throw CheckpointError(StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("checkpoint ", path, ": cannot open: ", errno_text()));
    direct[c.file] = d;
  }
  OrderedPipeline<Chunk> reader(chunks.size(), checkpoint_threads(), kChunksAhead, [&](size_t i) {
    const int fi = chunks[i].file;
    return read_chunk(chunks[i], m.opened[fi].parts[t], sh, fds[fi]->get(), direct[fi],
                      m.files[fi].path, th.name);
  });
  std::vector<int64_t> steps;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk c = reader.next();
    for (const auto& [p, v] : c.blocks) {
      // keys first (8-byte aligned), values and state right after (4-byte); the steps may not
      // be aligned.
      if (v.steps != nullptr) {
        steps.resize(v.n);
        std::memcpy(steps.data(), v.steps, v.n * sizeof(int64_t));
      }
      into.stage_rows(*out.staged, v.keys, v.values, v.state,
                      v.steps != nullptr ? steps.data() : nullptr, v.n);
      for (size_t j = 0; j < v.m; ++j)
        into.stage_pending(*out.staged, load_i64(v.pending, j), load_i64(v.pending, v.m + j),
                           load_i64(v.pending, 2 * v.m + j));
      out.n += v.n;
    }
  }
  into.finish_staged(*out.staged);
  return out;
}

}  // namespace cpu_dist::ps::ckpt
