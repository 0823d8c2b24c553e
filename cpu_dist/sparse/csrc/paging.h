// Pages of a shard's rows in partition order (hashing.h), for Dump: memory per page is bounded
// by the page, not the table.  A page holds the rows of whole partitions, except that a
// partition bigger than the page goes out in key ranges; rows inside a page are sorted by key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dump_page.h"
#include "table.h"

namespace cpu_dist::ps {

// PageCursor, kDefaultDumpPageBytes, kDumpReplyOverhead: dump_page.h (shared with the client).

struct PageKeys {
  std::vector<int64_t> keys;  // sorted ascending
  PageCursor next;            // where the next page starts (when !done)
  bool done = true;           // no rows after this page
};

// Selects the next page of at most max_rows (>= 1) rows from `from` on, in one pass over the
// table (one stripe locked at a time), holding at most max_rows + 1 keys.
PageKeys select_page(const ShardTable& table, const PageCursor& from, size_t max_rows);

// Payload bytes of one row in a Dump reply: key, values, state (state_floats of them).
inline size_t dump_row_bytes(uint32_t dim, uint32_t state_floats = 1) {
  return sizeof(int64_t) + (size_t{dim} + state_floats) * sizeof(float);
}

}  // namespace cpu_dist::ps
