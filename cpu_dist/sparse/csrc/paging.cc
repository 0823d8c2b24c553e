#include "paging.h"

#include <algorithm>
#include <iterator>
#include <memory>

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

// The `limit` smallest places after the cursor, ascending, and whether more exist.  One pass
// over the DRAM keys, bucketed by partition: while more than `limit` are held beyond the
// cursor's own partition, the highest partitions are dropped whole (so memory is the page plus
// at most one partition), and each page costs one pass, not one pass with a heap.
std::vector<Place> smallest_after(const ShardTable& table, const PageCursor& from, size_t limit,
                                  bool* more, uint32_t* held_end) {
  std::vector<std::vector<int64_t>> bucket(kNumPartitions);
  uint32_t& end = *held_end = kNumPartitions;  // partitions from `end` on are not held
  size_t held = 0;
  *more = false;
  const uint64_t salt = table.spec().salt();  // the table's partitions (hashing.h)
  table.for_each_key([&](int64_t key) {
    const uint32_t p = partition_of(key, salt);
    if (p >= end) {
      *more = true;
      return;
    }
    if (!after(Place{p, key}, from)) return;
    bucket[p].push_back(key);
    ++held;
    while (held > limit && end - 1 > from.partition) {
      --end;
      if (!bucket[end].empty()) *more = true;
      held -= bucket[end].size();
      std::vector<int64_t>().swap(bucket[end]);
    }
  });
  std::vector<Place> out;
  out.reserve(std::min(held, limit));
  for (uint32_t p = from.partition; p < end && out.size() < limit; ++p) {
    std::sort(bucket[p].begin(), bucket[p].end());
    for (int64_t k : bucket[p]) {
      if (out.size() == limit) {
        *more = true;
        break;
      }
      out.push_back(Place{p, k});
    }
  }
  // The SSD tier after DRAM (a row moving meanwhile is then seen at least once: table.h): its
  // key order is the page order, so its first `limit` rows after the cursor are a range scan.
  std::unique_ptr<TierStore::Cursor> cur = table.ssd_cursor(kNumPartitions, false);
  if (!cur) return out;
  std::vector<Place> ssd;
  cur->seek(from.partition, from.after_key_set, from.after_key);
  for (; ssd.size() < limit && cur->valid() && cur->partition() < end; cur->next())
    ssd.push_back(Place{cur->partition(), cur->key()});
  if (cur->valid() && (ssd.size() == limit || cur->partition() >= end)) *more = true;
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
  uint32_t held_end = kNumPartitions;
  std::vector<Place> places = smallest_after(table, from, max_rows + 1, &more, &held_end);
  PageKeys page;
  if (more && places.size() <= max_rows) {
    // Every row of the partitions before held_end is here, none after: a page edge.
    page.done = false;
    page.next = PageCursor{held_end, false, 0};
  } else if (places.size() > max_rows) {
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
