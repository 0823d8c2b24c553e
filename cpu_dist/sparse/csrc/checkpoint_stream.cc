#include "checkpoint_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "checkpoint_io.h"

namespace cpu_dist::ps::ckpt {

void AlignedBytes::reserve(size_t n) {
  if (n <= cap_) return;
  void* p = nullptr;
  if (::posix_memalign(&p, kIoAlign, align_up(n)) != 0) throw std::bad_alloc();
  p_.reset(static_cast<char*>(p));
  cap_ = align_up(n);
}

int open_maybe_direct(const std::string& path, int flags, bool* direct) {
  const char* knob = std::getenv("CPU_DIST_CHECKPOINT_DIRECT");  // "0": page cache only
  if (knob != nullptr && std::strcmp(knob, "0") == 0) {
    *direct = false;
    return ::open(path.c_str(), flags | O_CLOEXEC);
  }
  int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags | O_CLOEXEC);  // e.g. tmpfs
  return fd;
}

DirectWriter::DirectWriter(const std::string& path, uint64_t start, size_t buffer_bytes)
    : path_(path) {
  fd_ = open_maybe_direct(path, O_WRONLY, &direct_);
  if (fd_ < 0)
    throw CheckpointError(grpc::StatusCode::INTERNAL,
                          absl::StrCat("checkpoint ", path, ": cannot open: ", errno_text()));
  buf_.reserve(std::max(buffer_bytes, 2 * kIoAlign));
  file_off_ = direct_ ? align_down(start) : start;
  used_ = start - file_off_;
  std::memset(buf_.data(), 0, used_);
}

DirectWriter::~DirectWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void DirectWriter::flush_full() {
  pwrite_all(fd_, buf_.data(), used_, file_off_, path_);
  file_off_ += used_;
  used_ = 0;
}

void DirectWriter::append(const char* data, size_t n) {
  while (n > 0) {
    const size_t take = std::min(n, buf_.capacity() - used_);
    std::memcpy(buf_.data() + used_, data, take);
    used_ += take;
    data += take;
    n -= take;
    if (used_ == buf_.capacity()) flush_full();  // capacity is whole blocks
  }
}

uint64_t DirectWriter::finish() {
  const uint64_t end = offset();
  if (used_ > 0) {
    const size_t len = direct_ ? align_up(used_) : used_;
    std::memset(buf_.data() + used_, 0, len - used_);
    pwrite_all(fd_, buf_.data(), len, file_off_, path_);
    file_off_ += used_;
    used_ = 0;
  }
  if (direct_ && ::ftruncate(fd_, static_cast<off_t>(end)) != 0)
    throw CheckpointError(grpc::StatusCode::INTERNAL,
                          absl::StrCat("checkpoint ", path_, ": truncate failed: ", errno_text()));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0)
    throw CheckpointError(grpc::StatusCode::INTERNAL,
                          absl::StrCat("checkpoint ", path_, ": close failed: ", errno_text()));
  return end;
}

int64_t read_range(int fd, bool direct, uint64_t off, size_t len, AlignedBytes& buf,
                   const std::string& path) {
  const uint64_t first = direct ? align_down(off) : off;
  const uint64_t want = off + len - first;  // bytes that must arrive
  const uint64_t span = direct ? align_up(off + len) - first : want;
  buf.reserve(span);
  uint64_t got = 0;
  while (got < want) {
    const ssize_t r = ::pread(fd, buf.data() + got, span - got, static_cast<off_t>(first + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw CheckpointError(grpc::StatusCode::INTERNAL,
                            absl::StrCat("checkpoint ", path, ": read failed: ", errno_text()));
    if (r == 0) return -1;  // end of file
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(off - first);
}

size_t checkpoint_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return std::clamp<size_t>(n, 1, 4);
}

}  // namespace cpu_dist::ps::ckpt
