// An allocator that asks for transparent huge pages for big arrays.  A shard's key index is
// hundreds of MiB probed at random: with 4 KiB pages nearly every probe misses the TLB, and
// in a VM each miss is a two-level page walk.  Measured on a 12M-row restore: the index probes
// were most of the inserting threads' time.  Row blocks are read in order and do not use it
// (huge pages made their faults slower).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace cpu_dist::ps {

template <class T>
class HugePageAllocator {
 public:
  using value_type = T;
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding converts

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>().allocate(n);
    void* p = std::aligned_alloc(kHugePage, rounded(bytes));
    if (p == nullptr) throw std::bad_alloc();
    ::madvise(p, rounded(bytes), MADV_HUGEPAGE);  // a hint: without THP, 4 KiB pages
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePage) return std::allocator<T>().deallocate(p, n);
    std::free(p);
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }

 private:
  static size_t rounded(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
};

}  // namespace cpu_dist::ps
