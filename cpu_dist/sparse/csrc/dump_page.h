// Dump pages as client and shard both see them (proto DumpRequest/DumpResponse): where a page
// starts, the default page budget, and the rows a client assembles.  No server header: the
// client library includes this, never table.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpu_dist::ps {

// Where a page starts: partition `partition`, and inside it, with after_key_set, only the
// keys after `after_key`.
struct PageCursor {
  uint32_t partition = 0;
  bool after_key_set = false;
  int64_t after_key = 0;
};

// Dump pages: the default payload budget (one definition for client and shard), and what a
// reply adds beyond its rows (field headers, the cursor).
inline constexpr uint64_t kDefaultDumpPageBytes = 4 << 20;
inline constexpr uint64_t kDumpReplyOverhead = 128;

// Rows with their optimizer state, as a client assembles a dump (was table.h's TableDump):
// state_width floats of state per row (1; the table's dim for element-wise Adagrad).
struct DumpRows {
  std::vector<int64_t> keys;  // sorted ascending
  std::vector<float> values;  // keys.size() * dim
  std::vector<float> state;   // keys.size() * state_width
  uint32_t state_width = 1;
};

}  // namespace cpu_dist::ps
