// Sequential checkpoint I/O at disk speed.  Measured on this kind of machine (docs/DESIGN.md,
// "Measured facts"): a buffered save spent 42 % of its time copying pieces into the page cache
// and a restore 28 % copying them out, on the one thread that also gathered or staged the rows;
// the disk itself writes 1.4-1.7 GB/s with O_DIRECT and ~0.3-1.1 GB/s through the page cache.
// So files are written and read with O_DIRECT where the file system allows it (fallback:
// buffered), and the CPU work (gathering rows, checksums) runs on worker threads, in order,
// ahead of the thread that does the I/O.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cpu_dist::ps::ckpt {

// O_DIRECT needs offsets, lengths and buffer addresses aligned to the device's logical block;
// 4096 covers every block size in use.
inline constexpr size_t kIoAlign = 4096;

inline uint64_t align_down(uint64_t x) { return x / kIoAlign * kIoAlign; }
inline uint64_t align_up(uint64_t x) { return align_down(x + kIoAlign - 1); }

// A heap buffer aligned for O_DIRECT, not zero-filled.  Grows only.
class AlignedBytes {
 public:
  char* data() { return p_.get(); }
  const char* data() const { return p_.get(); }
  size_t capacity() const { return cap_; }
  // At least n bytes; the contents are lost when it grows.
  void reserve(size_t n);

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> p_;
  size_t cap_ = 0;
};

// Opens path with O_DIRECT added to flags where the file system allows it, else without
// (and never with CPU_DIST_CHECKPOINT_DIRECT=0 in the environment: file systems that accept
// O_DIRECT but serve it badly); *direct says which.  Returns the descriptor (-1 with errno set
// when neither opens).
int open_maybe_direct(const std::string& path, int flags, bool* direct);

// Appends bytes to a file from offset `start` on, through one aligned buffer written with
// O_DIRECT whenever it fills (a synchronous write: the threads preparing the next bytes run
// meanwhile).  The bytes before `start` in the first aligned block are written as zeros: the
// caller writes them (a header) afterwards, buffered, before it fsyncs.
class DirectWriter {
 public:
  DirectWriter(const std::string& path, uint64_t start, size_t buffer_bytes = 8u << 20);
  ~DirectWriter();
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;

  void append(const char* data, size_t n);
  // Where the next byte goes.
  uint64_t offset() const { return file_off_ + used_; }
  // Writes what is buffered and cuts the file to offset() (the last O_DIRECT write is padded
  // to a whole block).  Returns offset().
  uint64_t finish();

 private:
  void flush_full();
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  AlignedBytes buf_;
  uint64_t file_off_ = 0;  // file offset of buf_[0] (aligned when direct)
  size_t used_ = 0;        // bytes in buf_
};

// Reads [off, off + len) of fd into buf, which must hold align_up(off + len) - align_down(off)
// bytes; with `direct` the read is widened to whole blocks.  Returns where the range starts in
// buf, or -1 when the file ends first.
int64_t read_range(int fd, bool direct, uint64_t off, size_t len, AlignedBytes& buf,
                   const std::string& path);

// Items 0 .. count-1 made by `threads` worker threads with produce(i), taken in order by one
// consumer with next(); at most max_ahead items exist beyond the one the consumer last took,
// which bounds memory.  An exception thrown by produce(i) is thrown by the next() that would
// return item i.  The destructor stops the workers (after their current item) and joins them.
template <class Item>
class OrderedPipeline {
 public:
  OrderedPipeline(size_t count, size_t threads, size_t max_ahead,
                  std::function<Item(size_t)> produce)
      : count_(count), max_ahead_(max_ahead < 1 ? 1 : max_ahead), produce_(std::move(produce)) {
    const size_t n = std::min(threads < 1 ? size_t{1} : threads, count);
    for (size_t t = 0; t < n; ++t) workers_.emplace_back([this] { run(); });
  }
  ~OrderedPipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  OrderedPipeline(const OrderedPipeline&) = delete;
  OrderedPipeline& operator=(const OrderedPipeline&) = delete;

  Item next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.count(taken_) > 0; });
    Result r = std::move(done_.at(taken_));
    done_.erase(taken_);
    ++taken_;
    lock.unlock();
    cv_.notify_all();
    if (r.error) std::rethrow_exception(r.error);
    return std::move(r.item);
  }

 private:
  struct Result {
    Item item{};
    std::exception_ptr error;
  };
  void run() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || next_ >= count_ || next_ < taken_ + max_ahead_; });
        if (stop_ || next_ >= count_) return;
        i = next_++;
      }
      Result r;
      try {
        r.item = produce_(i);
      } catch (...) {
        r.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(i, std::move(r));
      }
      cv_.notify_all();
    }
  }

  const size_t count_, max_ahead_;
  const std::function<Item(size_t)> produce_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<size_t, Result> done_;
  size_t next_ = 0, taken_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: joined before the members above go
};

// Worker threads for checkpoint CPU work: the machine's cores, at least 1, at most 4.
size_t checkpoint_threads();

}  // namespace cpu_dist::ps::ckpt
