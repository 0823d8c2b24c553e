// A table's next slot blocks, faulted in on a thread of their own before the updates reach
// them.  In a VM a page the process never touched costs a fault, a zeroed page and an exit to
// the host (0.5-0.9 GB/s per thread, measured): a table that grows by a few thousand rows a
// step paid that inside every commit's apply, on the path every worker's next read waits on
// (W=2 default job: 11-14 ms of commit wait a step, 5-6.5 with the blocks faulted ahead).
//
// A stripe asks for its next block once its current one is half full (ShardTable decides);
// the block comes back through `deliver`, which files it as the stripe's spare only if the
// stripe still needs exactly that block.  So the memory held ahead is at most one block per
// growing stripe, and it is memory that the stripe's own growth is about to use.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace cpu_dist::ps {

struct FreeBlock {
  void operator()(char* p) const { std::free(p); }
};
using SlotBlock = std::unique_ptr<char, FreeBlock>;  // a table's slot block (malloc'd)

// Faults [p, p + bytes) in for writing, whole pages only, in one call (MADV_POPULATE_WRITE; it
// never changes a page that is there, so it may run beside writers).  False where the kernel
// lacks it (before 5.14): then nothing was done.
bool populate_pages(void* p, size_t bytes);
// Writes a zero byte into each whole page of [p, p + bytes): the fault-in of a kernel without
// MADV_POPULATE_WRITE, for memory that no other thread writes yet.
void touch_pages(void* p, size_t bytes);

class GrowAhead {
 public:
  // Files a faulted block (true), or drops it when the stripe no longer needs it (false):
  // called on this object's thread, with no lock of its own held.
  using Deliver = std::function<bool(size_t stripe, size_t block, SlotBlock& blk)>;

  explicit GrowAhead(Deliver deliver) : deliver_(std::move(deliver)) {}
  GrowAhead(const GrowAhead&) = delete;
  GrowAhead& operator=(const GrowAhead&) = delete;
  // Stops the thread; requests not yet served are dropped (their stripes fault as before).
  ~GrowAhead();

  // Queues block `block` (of `bytes`) of stripe `stripe`; never waits on the faulting.  The
  // thread starts with the first request (a table that never grows has none); where no thread
  // can be had, nothing is done.
  void request(size_t stripe, size_t block, size_t bytes);

  // Blocks filed so far (the table's stats).
  size_t filed() const;

 private:
  struct Request {
    size_t stripe, block, bytes;
  };
  void run();

  const Deliver deliver_;
  mutable std::mutex mu_;  // a leaf lock: nothing is taken while it is held
  std::condition_variable wake_;
  std::deque<Request> queue_;
  bool stop_ = false;
  bool failed_ = false;  // no thread could be started
  size_t filed_ = 0;
  std::thread thread_;  // last: started after everything it reads
};

}  // namespace cpu_dist::ps
