// Pages of a shard's rows in partition order (hashing.h), for Dump: memory per page is bounded
// by the page, not the table.  A page holds the rows of whole partitions, except that a
// partition bigger than the page goes out in key ranges; rows inside a page are sorted by key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "table.h"

namespace cpu_dist::ps {

// Where a page starts: partition `partition`, and inside it, with after_key_set, only the
// keys after `after_key`.
struct PageCursor {
  uint32_t partition = 0;
  bool after_key_set = false;
  int64_t after_key = 0;
};

struct PageKeys {
  std::vector<int64_t> keys;  // sorted ascending
  PageCursor next;            // where the next page starts (when !done)
  bool done = true;           // no rows after this page
};

// Selects the next page of at most max_rows (>= 1) rows from `from` on, in one pass over the
// table (one stripe locked at a time), holding at most max_rows + 1 keys.
PageKeys select_page(const ShardTable& table, const PageCursor& from, size_t max_rows);

// Dump pages: the default payload budget (one definition for client and shard), and what a
// reply adds beyond its rows (field headers, the cursor).
inline constexpr uint64_t kDefaultDumpPageBytes = 4 << 20;
inline constexpr uint64_t kDumpReplyOverhead = 128;

// Payload bytes of one row in a Dump reply: key, values, state (state_floats of them).
inline size_t dump_row_bytes(uint32_t dim, uint32_t state_floats = 1) {
  return sizeof(int64_t) + (size_t{dim} + state_floats) * sizeof(float);
}

}  // namespace cpu_dist::ps
