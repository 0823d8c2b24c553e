#include "paging.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <queue>

#include "hashing.h"

namespace cpu_dist::ps {

namespace {

// A row's place in the page order: partition, then key.
struct Place {
  uint32_t partition;
  int64_t key;
  bool operator<(const Place& o) const {
    return partition != o.partition ? partition < o.partition : key < o.key;
  }
};

bool after(const Place& p, const PageCursor& c) {
  if (p.partition != c.partition) return p.partition > c.partition;
  return !c.after_key_set || p.key > c.after_key;
}

// The `limit` smallest places after the cursor, ascending, and whether more exist.
std::vector<Place> smallest_after(const ShardTable& table, const PageCursor& from, size_t limit,
                                  bool* more) {
  std::priority_queue<Place> heap;  // max-heap: the largest kept place on top
  *more = false;
  table.for_each_key([&](int64_t key) {
    const Place p{partition_of(key), key};
    if (!after(p, from)) return;
    if (heap.size() < limit) {
      heap.push(p);
    } else if (p < heap.top()) {
      heap.pop();
      heap.push(p);
      *more = true;
    } else {
      *more = true;
    }
  });
  std::vector<Place> out(heap.size());
  for (size_t i = out.size(); i > 0; --i) {
    out[i - 1] = heap.top();
    heap.pop();
  }
  // The SSD tier after DRAM (a row moving meanwhile is then seen at least once: table.h): its
  // key order is the page order, so its first `limit` rows after the cursor are a range scan.
  std::unique_ptr<TierStore::Cursor> cur = table.ssd_cursor(kNumPartitions, false);
  if (!cur) return out;
  std::vector<Place> ssd;
  cur->seek(from.partition, from.after_key_set, from.after_key);
  for (; ssd.size() < limit && cur->valid(); cur->next())
    ssd.push_back(Place{cur->partition(), cur->key()});
  if (ssd.size() == limit && cur->valid()) *more = true;
  std::vector<Place> merged;
  merged.reserve(out.size() + ssd.size());
  std::set_union(out.begin(), out.end(), ssd.begin(), ssd.end(), std::back_inserter(merged));
  if (merged.size() > limit) {
    merged.resize(limit);
    *more = true;
  }
  return merged;
}

}  // namespace

PageKeys select_page(const ShardTable& table, const PageCursor& from, size_t max_rows) {
  max_rows = std::max<size_t>(max_rows, 1);
  bool more = false;
  std::vector<Place> places = smallest_after(table, from, max_rows + 1, &more);
  PageKeys page;
  more = more || places.size() > max_rows;
  if (more) {
    const Place next = places[max_rows];
    places.resize(max_rows);
    page.done = false;
    if (next.partition != places.back().partition) {
      page.next = PageCursor{next.partition, false, 0};  // the page ends on a partition edge
    } else if (places.front().partition == next.partition) {
      page.next = PageCursor{next.partition, true, places.back().key};  // one big partition
    } else {  // the last partition does not fit whole: it starts the next page
      const uint32_t cut = next.partition;
      while (places.back().partition == cut) places.pop_back();
      page.next = PageCursor{cut, false, 0};
    }
  }
  page.keys.reserve(places.size());
  for (const Place& p : places) page.keys.push_back(p.key);
  std::sort(page.keys.begin(), page.keys.end());
  return page;
}

}  // namespace cpu_dist::ps
