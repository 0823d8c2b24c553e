#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "hashing.h"

namespace cpu_dist::ps::ckpt {

namespace {

using grpc::StatusCode;
constexpr char kMagic[8] = {'C', 'P', 'U', 'D', 'P', 'S', 'C', 'K'};
constexpr size_t kFixedHeader = 48;  // magic .. table_len
constexpr size_t kMaxTableLen = 4096;

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, reporting errors (a failed close can mean lost writes).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

uint32_t crc(uint32_t c, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes 32-bit lengths
    const uInt take = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = static_cast<uint32_t>(crc32(c, p, take));
    p += take;
    n -= take;
  }
  return c;
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t off, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw CheckpointError(StatusCode::INTERNAL,
                            absl::StrCat("checkpoint ", path, ": write failed: ", errno_text()));
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

// False at end of file.
bool pread_all(int fd, void* data, size_t n, uint64_t off) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

size_t header_size(size_t table_len) {
  return kFixedHeader + table_len + kNumPartitions * (sizeof(uint64_t) + sizeof(uint32_t)) +
         sizeof(uint32_t);
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void fsync_parent(const std::filesystem::path& p) {
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() >= 0) ::fsync(d.get());
}

}  // namespace

SaveResult save_shard(const ShardTable& table, const ShardMeta& meta, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec)
    throw CheckpointError(StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("checkpoint ", path, ": cannot create its directory: ",
                                       ec.message()));
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (f.get() < 0)
    throw CheckpointError(StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("checkpoint ", tmp, ": cannot create: ", errno_text()));
  const uint32_t dim = table.dim();
  const size_t hsize = header_size(meta.table.size());
  std::vector<uint64_t> prows(kNumPartitions, 0);
  std::vector<uint32_t> pcrc(kNumPartitions, 0);
  SaveResult res;
  try {
    table.with_snapshot([&](const std::vector<ShardTable::RowRef>& refs) {
      const size_t n = refs.size();
      std::vector<uint32_t> part(n);
      for (size_t i = 0; i < n; ++i) ++prows[part[i] = partition_of(refs[i].key)];
      std::vector<uint64_t> start(kNumPartitions + 1, 0);
      for (uint32_t p = 0; p < kNumPartitions; ++p) start[p + 1] = start[p] + prows[p];
      std::vector<uint64_t> pos(start.begin(), start.end() - 1);
      std::vector<uint32_t> order(n);
      for (size_t i = 0; i < n; ++i) order[pos[part[i]]++] = static_cast<uint32_t>(i);
      std::vector<char> buf;
      uint64_t off = hsize;
      for (uint32_t p = 0; p < kNumPartitions; ++p) {
        const size_t m = prows[p];
        if (m == 0) continue;
        auto first = order.begin() + static_cast<std::ptrdiff_t>(start[p]);
        std::sort(first, first + static_cast<std::ptrdiff_t>(m),
                  [&](uint32_t a, uint32_t b) { return refs[a].key < refs[b].key; });
        buf.resize(m * (sizeof(int64_t) + (dim + 1) * sizeof(float)));
        char* k = buf.data();
        char* v = k + m * sizeof(int64_t);
        char* s = v + m * dim * sizeof(float);
        for (size_t j = 0; j < m; ++j) {
          if (j + 8 < m) __builtin_prefetch(refs[first[static_cast<std::ptrdiff_t>(j + 8)]].values);
          const ShardTable::RowRef& r = refs[first[static_cast<std::ptrdiff_t>(j)]];
          std::memcpy(k + j * sizeof(int64_t), &r.key, sizeof(int64_t));
          std::memcpy(v + j * dim * sizeof(float), r.values, dim * sizeof(float));
          std::memcpy(s + j * sizeof(float), &r.state, sizeof(float));
        }
        pcrc[p] = crc(0, buf.data(), buf.size());
        pwrite_all(f.get(), buf.data(), buf.size(), off, tmp);
        off += buf.size();
      }
      res.rows = n;
      res.bytes = off;
    });
    std::string h;
    h.reserve(hsize);
    h.append(kMagic, sizeof(kMagic));
    put<uint32_t>(h, kFormatVersion);
    put<uint32_t>(h, dim);
    put<uint32_t>(h, meta.shard_index);
    put<uint32_t>(h, meta.num_shards);
    put<int64_t>(h, meta.step);
    put<uint64_t>(h, res.rows);
    put<uint32_t>(h, kNumPartitions);
    put<uint32_t>(h, static_cast<uint32_t>(meta.table.size()));
    h += meta.table;
    h.append(reinterpret_cast<const char*>(prows.data()), prows.size() * sizeof(uint64_t));
    h.append(reinterpret_cast<const char*>(pcrc.data()), pcrc.size() * sizeof(uint32_t));
    res.checksum = crc(0, h.data(), h.size());
    put<uint32_t>(h, res.checksum);
    pwrite_all(f.get(), h.data(), h.size(), 0, tmp);
    if (::fsync(f.get()) != 0 || f.close() != 0)
      throw CheckpointError(StatusCode::INTERNAL,
                            absl::StrCat("checkpoint ", tmp, ": flush failed: ", errno_text()));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw CheckpointError(StatusCode::INTERNAL, absl::StrCat("checkpoint ", path,
                                                               ": rename failed: ", errno_text()));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_parent(target);
  return res;
}

namespace {

// One shard file whose header has been read and checked.
struct OpenedFile {
  std::unique_ptr<Fd> fd;
  std::vector<uint64_t> rows;    // per partition
  std::vector<uint32_t> crcs;    // per partition
  std::vector<uint64_t> offset;  // per partition: where its block starts
};

OpenedFile open_checked(const FileSpec& spec, const std::string& table, uint32_t dim,
                        size_t row_bytes, int64_t* step) {
  const std::string where = absl::StrCat("checkpoint ", spec.path, ": ");
  auto fail = [&](StatusCode code, const std::string& what) {
    return CheckpointError(code, where + what);
  };
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
  char fixed[kFixedHeader];
  if (!pread_all(fd, fixed, kFixedHeader, 0))
    throw fail(StatusCode::DATA_LOSS, absl::StrCat("truncated (", size, " bytes, no header)"));
  if (std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0)
    throw fail(StatusCode::DATA_LOSS, "not a cpu_dist PS checkpoint file (bad magic)");
  const uint32_t version = get<uint32_t>(fixed + 8);
  if (version != kFormatVersion)
    throw fail(StatusCode::FAILED_PRECONDITION,
               absl::StrCat("format version ", version, ", this build reads version ",
                            kFormatVersion));
  const uint32_t fdim = get<uint32_t>(fixed + 12);
  const int64_t fstep = get<int64_t>(fixed + 24);
  const uint64_t rows = get<uint64_t>(fixed + 32);
  const uint32_t nparts = get<uint32_t>(fixed + 40);
  const uint32_t table_len = get<uint32_t>(fixed + 44);
  if (nparts != kNumPartitions || table_len > kMaxTableLen)
    throw fail(StatusCode::DATA_LOSS, "corrupt header");
  const size_t hsize = header_size(table_len);
  std::string h(hsize, '\0');
  if (!pread_all(fd, h.data(), hsize, 0))
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("truncated (", size, " bytes, header of ", hsize, ")"));
  const uint32_t stored = get<uint32_t>(h.data() + hsize - 4);
  const uint32_t actual = crc(0, h.data(), hsize - 4);
  if (stored != actual)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("corrupt header (crc32 ", actual, ", stored ", stored, ")"));
  if (spec.bytes != 0 && stored != spec.checksum)
    throw fail(StatusCode::DATA_LOSS,
               absl::StrCat("header checksum ", stored, " is not the manifest's ", spec.checksum,
                            " (a file of another checkpoint?)"));
  const std::string ftable = h.substr(kFixedHeader, table_len);
  if (ftable != table)
    throw fail(StatusCode::INVALID_ARGUMENT,
               absl::StrCat("holds table '", ftable, "', this shard serves '", table, "'"));
  if (fdim != dim)
    throw fail(StatusCode::INVALID_ARGUMENT,
               absl::StrCat("rows of dim ", fdim, ", the table's dim is ", dim));
  *step = fstep;
  of.rows.resize(kNumPartitions);
  of.crcs.resize(kNumPartitions);
  of.offset.resize(kNumPartitions);
  std::memcpy(of.rows.data(), h.data() + kFixedHeader + table_len,
              kNumPartitions * sizeof(uint64_t));
  std::memcpy(of.crcs.data(), h.data() + kFixedHeader + table_len + kNumPartitions * 8,
              kNumPartitions * sizeof(uint32_t));
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

LoadedRows load_for_shard(const std::vector<FileSpec>& files, const std::string& table_name,
                          const ShardTable& table, uint32_t shard_index, uint32_t num_shards) {
  const uint32_t dim = table.dim();
  if (files.empty()) throw CheckpointError(StatusCode::INVALID_ARGUMENT, "no checkpoint files");
  if (num_shards == 0 || shard_index >= num_shards)
    throw CheckpointError(StatusCode::INVALID_ARGUMENT, "bad shard index");
  const size_t row_bytes = sizeof(int64_t) + (static_cast<size_t>(dim) + 1) * sizeof(float);
  // Pass 1: every header, so that a bad file is refused before gigabytes are read, and the
  // owned rows can be counted (and allocated once).
  std::vector<OpenedFile> opened;
  std::vector<int> owner(kNumPartitions, -1);
  LoadedRows out;
  size_t total = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    int64_t step = -1;
    opened.push_back(open_checked(files[fi], table_name, dim, row_bytes, &step));
    if (fi == 0) {
      out.step = step;
    } else if (step != out.step) {
      throw CheckpointError(StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("checkpoint ", files[fi].path, ": holds step ", step,
                                         ", ", files[0].path, " holds step ", out.step));
    }
    for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
      if (opened[fi].rows[p] == 0) continue;
      if (owner[p] >= 0)
        throw CheckpointError(StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("checkpoint ", files[fi].path, ": partition ", p,
                                           " is also in ", files[owner[p]].path));
      owner[p] = static_cast<int>(fi);
      total += opened[fi].rows[p];
    }
  }
  out.staged = table.new_staged(total);
  // Pass 2: the owned partition blocks, one at a time through one buffer (so only the
  // staged table's memory is new), each checksum checked before its rows are staged.
  std::unique_ptr<char[]> buf;
  size_t buf_len = 0;
  for (uint32_t p = shard_index; p < kNumPartitions; p += num_shards) {
    if (owner[p] < 0) continue;
    const OpenedFile& of = opened[owner[p]];
    const std::string& path = files[owner[p]].path;
    const size_t m = of.rows[p];
    const size_t len = m * row_bytes;
    if (len > buf_len) {
      buf.reset(new char[len]);  // default-initialised: no zero-fill
      buf_len = len;
    }
    if (!pread_all(of.fd->get(), buf.get(), len, of.offset[p]))
      throw CheckpointError(StatusCode::DATA_LOSS, absl::StrCat("checkpoint ", path,
                                                                ": truncated"));
    // Aligned in the buffer: keys first (8-byte), values and state right after (4-byte).
    const int64_t* k = reinterpret_cast<const int64_t*>(buf.get());
    const float* v = reinterpret_cast<const float*>(buf.get() + m * sizeof(int64_t));
    const float* s = v + m * dim;
    const uint32_t got = crc(0, buf.get(), len);
    if (got != of.crcs[p])
      throw CheckpointError(StatusCode::DATA_LOSS,
                            absl::StrCat("checkpoint ", path, ": partition ", p,
                                         " is corrupt (crc32 ", got, ", header says ",
                                         of.crcs[p], ")"));
    for (size_t j = 0; j < m; ++j) {
      if (partition_of(k[j]) != p)
        throw CheckpointError(StatusCode::DATA_LOSS,
                              absl::StrCat("checkpoint ", path, ": key ", k[j],
                                           " stored in partition ", p));
      if (j > 0 && k[j] <= k[j - 1])  // ascending: no key twice
        throw CheckpointError(StatusCode::DATA_LOSS,
                              absl::StrCat("checkpoint ", path, ": keys of partition ", p,
                                           " are not ascending"));
    }
    table.stage_rows(*out.staged, k, v, s, m);
    out.n += m;
  }
  return out;
}

}  // namespace cpu_dist::ps::ckpt
