#include "grow_ahead.h"

#include <sys/mman.h>

#include <cstdint>
#include <system_error>
#include <utility>

namespace cpu_dist::ps {

namespace {
constexpr uintptr_t kPage = 4096;

// The whole pages of [p, p + bytes), as [lo, hi) addresses.
std::pair<uintptr_t, uintptr_t> whole_pages(void* p, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  return {(at + kPage - 1) / kPage * kPage, (at + bytes) / kPage * kPage};
}
}  // namespace

bool populate_pages(void* p, size_t bytes) {
  const auto [lo, hi] = whole_pages(p, bytes);
  if (hi <= lo) return true;  // no whole page
  return ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0;
}

void touch_pages(void* p, size_t bytes) {
  const auto [lo, hi] = whole_pages(p, bytes);
  for (uintptr_t a = lo; a < hi; a += kPage) *reinterpret_cast<volatile char*>(a) = 0;
}

GrowAhead::~GrowAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GrowAhead::request(size_t stripe, size_t block, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || failed_) return;
    queue_.push_back({stripe, block, bytes});
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::system_error&) {  // no thread: the stripes fault as they grow
        failed_ = true;
        queue_.clear();
        return;
      }
    }
  }
  wake_.notify_one();
}

size_t GrowAhead::filed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return filed_;
}

void GrowAhead::run() {
  for (;;) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      r = queue_.front();
      queue_.pop_front();
    }
    // Page-aligned, so that every page of the block is faulted here.
    const size_t bytes = (r.bytes + kPage - 1) / kPage * kPage;
    SlotBlock blk(static_cast<char*>(std::aligned_alloc(kPage, bytes)));
    if (blk == nullptr) continue;  // the stripe allocates (and reports) it itself
    if (!populate_pages(blk.get(), bytes)) touch_pages(blk.get(), bytes);  // this thread's alone
    if (!deliver_(r.stripe, r.block, blk)) continue;  // blk frees what was not filed
    std::lock_guard<std::mutex> lock(mu_);
    ++filed_;
  }
}

}  // namespace cpu_dist::ps
