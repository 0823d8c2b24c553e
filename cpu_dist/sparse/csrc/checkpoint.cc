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
#include <new>

#include "absl/strings/str_cat.h"
#include "checkpoint_io.h"
#include "hashing.h"

namespace cpu_dist::ps::ckpt {

using grpc::StatusCode;

namespace {
constexpr size_t kMaxTableLen = 4096;
struct FreeBytes {
  void operator()(char* p) const { std::free(p); }
};
}  // namespace

namespace {

// One shard file whose header has been read and checked.
struct OpenedFile {
  std::unique_ptr<Fd> fd;
  std::vector<uint64_t> rows;    // per partition
  std::vector<uint32_t> crcs;    // per partition
  std::vector<uint64_t> offset;  // per partition: where its block starts
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
  if (fixed.format_version != kFormatVersion)
    throw fail(StatusCode::FAILED_PRECONDITION,
               absl::StrCat("format version ", fixed.format_version, ", this build reads version ",
                            kFormatVersion));
  if (fixed.num_partitions != kNumPartitions || fixed.table_len > kMaxTableLen)
    throw fail(StatusCode::DATA_LOSS, "corrupt header");
  const size_t hsize = header_size(fixed.table_len);
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
                        size_t row_bytes, int64_t* step) {
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
  of.rows = std::move(h.partition_rows);
  of.crcs = std::move(h.partition_crc);
  of.offset.resize(kNumPartitions);
  const uint64_t hsize = header_size(h.fixed.table_len), rows = h.fixed.rows;
  uint64_t total = 0, off = hsize;
  for (uint32_t p = 0; p < kNumPartitions; ++p) {
    if (of.rows[p] > size / row_bytes) throw fail(StatusCode::DATA_LOSS, "corrupt header");
    of.offset[p] = off;
    off += of.rows[p] * row_bytes;
    total += of.rows[p];
  }
  if (total != rows || hsize + rows * row_bytes != size)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("truncated or corrupt (", size, " bytes; the header's ", rows,
                            " rows need ", hsize + rows * row_bytes, ")"));
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

LoadPlan plan_load(const std::vector<FileSpec>& files, const std::string& table_name, uint32_t dim,
                   uint32_t shard_index, uint32_t num_shards) {
  const size_t row_bytes = sizeof(int64_t) + (static_cast<size_t>(dim) + 1) * sizeof(float);
  LoadPlan plan;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    int64_t step = -1;
    plan.opened.push_back(open_checked(files[fi], table_name, dim, row_bytes, &step));
    if (fi == 0) {
      plan.step = step;
    } else if (step != plan.step) {
      throw CheckpointError(StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("checkpoint ", files[fi].path, ": holds step ", step, ", ",
                                         files[0].path, " holds step ", plan.step));
    }
    for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
      if (plan.opened[fi].rows[p] == 0) continue;
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

// A partition's block as read into memory (keys, values, state; see checkpoint_format.h).
// Checks its checksum, and that its keys belong to it, ascending.
void check_block(const char* block, size_t m, uint32_t p, uint32_t expected_crc, size_t len,
                 const std::string& path) {
  const uint32_t got = crc32_of(0, block, len);
  if (got != expected_crc)
    throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path, ": partition ",
                                                              p, " is corrupt (crc32 ", got,
                                                              ", header says ", expected_crc, ")"));
  const int64_t* k = reinterpret_cast<const int64_t*>(block);
  for (size_t j = 0; j < m; ++j) {
    if (partition_of(k[j]) != p)
      throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path, ": key ", k[j],
                                                                " stored in partition ", p));
    if (j > 0 && k[j] <= k[j - 1])  // ascending: no key twice
      throw CheckpointError(
          StatusCode::DATA_LOSS,
          absl::StrCat("checkpoint ", path, ": keys of partition ", p, " are not ascending"));
  }
}

}  // namespace

LoadedRows load_for_shard(const std::vector<FileSpec>& files, const std::string& table_name,
                          const ShardTable& table, uint32_t shard_index, uint32_t num_shards) {
  const uint32_t dim = table.dim();
  if (files.empty()) throw CheckpointError(StatusCode::INVALID_ARGUMENT, "no checkpoint files");
  if (num_shards == 0 || shard_index >= num_shards)
    throw CheckpointError(StatusCode::INVALID_ARGUMENT, "bad shard index");
  const size_t row_bytes = sizeof(int64_t) + (static_cast<size_t>(dim) + 1) * sizeof(float);
  const LoadPlan plan = plan_load(files, table_name, dim, shard_index, num_shards);
  LoadedRows out;
  out.step = plan.step;
  out.staged = table.new_staged(plan.rows);
  // Pass 2: the owned partition blocks, one at a time through one buffer (so only the
  // staged table's memory is new), each checked before its rows are staged.
  std::unique_ptr<char[], FreeBytes> buf;
  size_t buf_len = 0;
  for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
    if (plan.owner[p] < 0) continue;
    const OpenedFile& of = plan.opened[plan.owner[p]];
    const std::string& path = files[plan.owner[p]].path;
    const size_t m = of.rows[p];
    const size_t len = m * row_bytes;
    if (len > buf_len) {
      buf.reset(static_cast<char*>(std::malloc(len)));  // malloc: no zero-fill
      if (buf == nullptr) throw std::bad_alloc();
      buf_len = len;
    }
    if (!pread_all(of.fd->get(), buf.get(), len, of.offset[p]))
      throw CheckpointError(StatusCode::DATA_LOSS,
                            absl::StrCat("checkpoint ", path, ": truncated"));
    check_block(buf.get(), m, p, of.crcs[p], len, path);
    // Aligned in the buffer: keys first (8-byte), values and state right after (4-byte).
    const int64_t* k = reinterpret_cast<const int64_t*>(buf.get());
    const float* v = reinterpret_cast<const float*>(buf.get() + m * sizeof(int64_t));
    table.stage_rows(*out.staged, k, v, v + m * dim, m);
    out.n += m;
  }
  return out;
}

}  // namespace cpu_dist::ps::ckpt
