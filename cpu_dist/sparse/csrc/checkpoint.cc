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

namespace cpu_dist::ps::ckpt {

using grpc::StatusCode;

namespace {
constexpr size_t kMaxTableLen = 4096;
}  // namespace

namespace {

// One shard file whose header has been read and checked.
struct OpenedFile {
  std::unique_ptr<Fd> fd;
  uint32_t version = kFormatVersion;
  std::vector<uint64_t> rows;     // per partition
  std::vector<uint64_t> pending;  // per partition: counts of keys without a row (version 2)
  std::vector<uint32_t> crcs;     // per partition
  std::vector<uint64_t> offset;   // per partition: where its block starts
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
FileHeader read_header(int fd, uint64_t size, const FileSpec& spec, const FileErrors& fail) {
  char fixed_bytes[sizeof(FixedHeader)];
  if (!pread_all(fd, fixed_bytes, sizeof(fixed_bytes), 0))
    throw fail(StatusCode::DATA_LOSS, absl::StrCat("truncated (", size, " bytes, no header)"));
  const FixedHeader fixed = decode_fixed(fixed_bytes);
  if (std::memcmp(fixed.magic, FixedHeader().magic, sizeof(fixed.magic)) != 0)
    throw fail(StatusCode::DATA_LOSS, "not a cpu_dist PS checkpoint file (bad magic)");
  if (fixed.format_version < kOldestFormatVersion || fixed.format_version > kFormatVersion)
    throw fail(StatusCode::FAILED_PRECONDITION,
               absl::StrCat("format version ", fixed.format_version, ", this build reads versions ",
                            kOldestFormatVersion, " to ", kFormatVersion));
  if (fixed.num_partitions != kNumPartitions || fixed.table_len > kMaxTableLen)
    throw fail(StatusCode::DATA_LOSS, "corrupt header");
  const size_t hsize = header_size(fixed.table_len, kNumPartitions, fixed.format_version);
  std::string bytes(hsize, '\0');
  if (!pread_all(fd, bytes.data(), hsize, 0))
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("truncated (", size, " bytes, header of ", hsize, ")"));
  FileHeader h = decode_header(bytes);
  const uint32_t actual = crc32_of(0, bytes.data(), hsize - sizeof(h.header_crc));
  if (h.header_crc != actual)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("corrupt header (crc32 ", actual, ", stored ", h.header_crc, ")"));
  if (spec.bytes != 0 && h.header_crc != spec.checksum)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("header checksum ", h.header_crc, " is not the manifest's ",
                            spec.checksum, " (a file of another checkpoint?)"));
  return h;
}

OpenedFile open_checked(const FileSpec& spec, const std::string& table, uint32_t dim,
                        int64_t* step) {
  const FileErrors fail{absl::StrCat("checkpoint ", spec.path, ": ")};
  OpenedFile of;
  of.fd = std::make_unique<Fd>(::open(spec.path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = of.fd->get();
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
  FileHeader h = read_header(fd, size, spec, fail);
  if (h.table != table)
    throw fail(StatusCode::INVALID_ARGUMENT,
               absl::StrCat("holds table '", h.table, "', this shard serves '", table, "'"));
  if (h.fixed.dim != dim)
    throw fail(StatusCode::INVALID_ARGUMENT,
               absl::StrCat("rows of dim ", h.fixed.dim, ", the table's dim is ", dim));
  *step = h.fixed.step;
  of.version = h.fixed.format_version;
  of.rows = std::move(h.partition_rows);
  of.pending = std::move(h.partition_pending);
  of.crcs = std::move(h.partition_crc);
  of.offset.resize(kNumPartitions);
  const uint64_t row_bytes = block_row_bytes(dim, of.version);
  const uint64_t hsize = header_size(h.fixed.table_len, kNumPartitions, of.version);
  const uint64_t rows = h.fixed.rows;
  uint64_t total = 0, off = hsize;
  for (uint32_t p = 0; p < kNumPartitions; ++p) {
    if (of.rows[p] > size / row_bytes || of.pending[p] > size / kPendingBytes)
      throw fail(StatusCode::DATA_LOSS, "corrupt header");
    of.offset[p] = off;
    off += of.rows[p] * row_bytes + of.pending[p] * kPendingBytes;
    total += of.rows[p];
  }
  if (total != rows || off != size)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("truncated or corrupt (", size, " bytes; the header's ", rows,
                            " rows need ", off, ")"));
  return of;
}

}  // namespace

namespace {

// Pass 1 of a load: every file's header, so that a bad file is refused before gigabytes are
// read, and which file holds each partition this shard owns (owner[p], -1: none).
struct LoadPlan {
  std::vector<OpenedFile> opened;
  std::vector<int> owner = std::vector<int>(kNumPartitions, -1);
  size_t rows = 0;  // owned rows in all
  int64_t step = -1;
};

// A partition's block: where its parts start (see checkpoint_format.h).
struct BlockView {
  const int64_t* keys;  // aligned (a copy where the block's are not)
  const float* values;
  const float* state;
  const char* steps;    // int64[n], maybe unaligned; null in version 1
  const char* pending;  // int64 keys[m], counts[m], last_seen[m], maybe unaligned
  size_t n, m;
};

BlockView view_block(const char* b, size_t n, size_t m, uint32_t dim, uint32_t version) {
  BlockView v{};
  v.n = n;
  v.m = m;
  v.keys = reinterpret_cast<const int64_t*>(b);
  v.values = reinterpret_cast<const float*>(b + n * sizeof(int64_t));
  v.state = v.values + n * dim;
  const char* after = b + n * (sizeof(int64_t) + (size_t{dim} + 1) * sizeof(float));
  v.steps = version >= 2 ? after : nullptr;
  v.pending = version >= 2 ? after + n * sizeof(int64_t) : nullptr;
  return v;
}

int64_t load_i64(const char* p, size_t i) {
  int64_t v;
  std::memcpy(&v, p + i * sizeof(v), sizeof(v));
  return v;
}

LoadPlan plan_load(const std::vector<FileSpec>& files, const std::string& table_name, uint32_t dim,
                   uint32_t shard_index, uint32_t num_shards) {
  LoadPlan plan;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    int64_t step = -1;
    plan.opened.push_back(open_checked(files[fi], table_name, dim, &step));
    if (fi == 0) {
      plan.step = step;
    } else if (step != plan.step) {
      throw CheckpointError(StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("checkpoint ", files[fi].path, ": holds step ", step, ", ",
                                         files[0].path, " holds step ", plan.step));
    }
    for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
      if (plan.opened[fi].rows[p] == 0 && plan.opened[fi].pending[p] == 0) continue;
      if (plan.owner[p] >= 0)
        throw CheckpointError(StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("checkpoint ", files[fi].path, ": partition ", p,
                                           " is also in ", files[plan.owner[p]].path));
      plan.owner[p] = static_cast<int>(fi);
      plan.rows += plan.opened[fi].rows[p];
    }
  }
  return plan;
}

// Keys of partition p, ascending (so no key twice); `what`: "keys" or "counted keys".
template <class Get>
void check_keys(Get key, size_t n, uint32_t p, const char* what, const std::string& path) {
  for (size_t j = 0; j < n; ++j) {
    const int64_t k = key(j);
    if (partition_of(k) != p)
      throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path, ": key ", k,
                                                                " stored in partition ", p));
    if (j > 0 && k <= key(j - 1))
      throw CheckpointError(
          StatusCode::DATA_LOSS,
          absl::StrCat("checkpoint ", path, ": ", what, " of partition ", p, " are not ascending"));
  }
}

// A partition's block as read into memory.  Checks its checksum, and that its keys and its
// counted keys belong to it, ascending.
void check_block(const char* block, const BlockView& v, uint32_t p, uint32_t expected_crc,
                 size_t len, const std::string& path) {
  const uint32_t got = crc32_of(0, block, len);
  if (got != expected_crc)
    throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path, ": partition ",
                                                              p, " is corrupt (crc32 ", got,
                                                              ", header says ", expected_crc, ")"));
  check_keys([&](size_t j) { return v.keys[j]; }, v.n, p, "keys", path);
  if (v.m > 0)
    check_keys([&](size_t j) { return load_i64(v.pending, j); }, v.m, p, "counted keys", path);
}

}  // namespace

namespace {

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

std::vector<ChunkSpec> plan_chunks(const LoadPlan& plan, uint32_t shard_index, uint32_t num_shards,
                                   uint32_t dim) {
  std::vector<ChunkSpec> chunks;
  uint64_t in_chunk = 0, end = 0;
  for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
    if (plan.owner[p] < 0) continue;
    const OpenedFile& of = plan.opened[plan.owner[p]];
    const uint64_t len =
        of.rows[p] * block_row_bytes(dim, of.version) + of.pending[p] * kPendingBytes;
    const bool joins = !chunks.empty() && chunks.back().file == plan.owner[p] &&
                       end == of.offset[p] && in_chunk + len <= kChunkBytes;
    if (!joins) {
      chunks.push_back(ChunkSpec{plan.owner[p], {}});
      in_chunk = 0;
    }
    chunks.back().blocks.push_back(BlockSpec{p, of.offset[p], len});
    in_chunk += len;
    end = of.offset[p] + len;
  }
  return chunks;
}

Chunk read_chunk(const ChunkSpec& spec, const OpenedFile& of, int fd, bool direct,
                 const std::string& path, uint32_t dim) {
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
    // A row takes 4 mod 8 bytes, so about half the blocks start 4 bytes off: then only their
    // keys are copied (the floats are 4-byte aligned in place); a block off by less, whole.
    if (reinterpret_cast<uintptr_t>(block) % alignof(float) != 0) block = moved(block, b.len);
    BlockView v = view_block(block, of.rows[b.p], of.pending[b.p], dim, of.version);
    if (reinterpret_cast<uintptr_t>(block) % alignof(int64_t) != 0)
      v.keys = reinterpret_cast<const int64_t*>(moved(block, v.n * sizeof(int64_t)));
    check_block(block, v, b.p, of.crcs[b.p], b.len, path);
    c.blocks.emplace_back(b.p, v);
  }
  return c;
}

}  // namespace

LoadedRows load_for_shard(const std::vector<FileSpec>& files, const std::string& table_name,
                          const ShardTable& table, uint32_t shard_index, uint32_t num_shards) {
  const uint32_t dim = table.dim();
  if (files.empty()) throw CheckpointError(StatusCode::INVALID_ARGUMENT, "no checkpoint files");
  if (num_shards == 0 || shard_index >= num_shards)
    throw CheckpointError(StatusCode::INVALID_ARGUMENT, "bad shard index");
  const LoadPlan plan = plan_load(files, table_name, dim, shard_index, num_shards);
  LoadedRows out;
  out.step = plan.step;
  out.staged = table.new_staged(plan.rows, checkpoint_threads());
  // Pass 2: the owned partition blocks, read (O_DIRECT where possible) and checked by worker
  // threads a few chunks ahead, staged by this thread in partition order.
  std::vector<std::unique_ptr<Fd>> fds;
  std::vector<bool> direct;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    bool d = false;
    fds.push_back(std::make_unique<Fd>(open_maybe_direct(files[fi].path, O_RDONLY, &d)));
    if (fds.back()->get() < 0)
      throw CheckpointError(
          StatusCode::FAILED_PRECONDITION,
          absl::StrCat("checkpoint ", files[fi].path, ": cannot open: ", errno_text()));
    direct.push_back(d);
  }
  const std::vector<ChunkSpec> chunks = plan_chunks(plan, shard_index, num_shards, dim);
  OrderedPipeline<Chunk> reader(chunks.size(), checkpoint_threads(), kChunksAhead, [&](size_t i) {
    const int fi = chunks[i].file;
    return read_chunk(chunks[i], plan.opened[fi], fds[fi]->get(), direct[fi], files[fi].path, dim);
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
      table.stage_rows(*out.staged, v.keys, v.values, v.state,
                       v.steps != nullptr ? steps.data() : nullptr, v.n);
      for (size_t j = 0; j < v.m; ++j)
        table.stage_pending(*out.staged, load_i64(v.pending, j), load_i64(v.pending, v.m + j),
                            load_i64(v.pending, 2 * v.m + j));
      out.n += v.n;
    }
  }
  table.finish_staged(*out.staged);
  return out;
}

}  // namespace cpu_dist::ps::ckpt
