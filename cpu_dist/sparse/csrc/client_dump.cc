// PsClient: dumps in pages.  Every shard is asked for its next page at once (dump_round, in
// client_admin.cc); dump() assembles every page into one key-sorted result, DumpPager hands
// the pages out one at a time for streaming writers.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "client.h"

namespace cpu_dist::ps {

namespace {

// A page's rows (sorted by key by the shard), copied out of the reply.
TableDump page_rows(const DumpResponse& p, uint32_t dim) {
  const size_t n = p.keys().size() / sizeof(int64_t);
  TableDump d;
  d.keys.resize(n);
  d.values.resize(n * dim);
  d.state.resize(n);
  if (n == 0) return d;
  std::memcpy(d.keys.data(), p.keys().data(), n * sizeof(int64_t));
  std::memcpy(d.values.data(), p.values().data(), n * dim * sizeof(float));
  std::memcpy(d.state.data(), p.state().data(), n * sizeof(float));
  return d;
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

DumpPager::DumpPager(PsClient& client, uint64_t max_bytes)
    : client_(client), max_bytes_(max_bytes), shards_(client.num_shards()) {}

bool DumpPager::next(TableDump* page) {
  while (ready_.empty()) {
    std::vector<uint32_t> ids;
    std::vector<PageCursor> from;
    for (uint32_t s = 0; s < shards_.size(); ++s)
      if (!shards_[s].done) {
        ids.push_back(s);
        from.push_back(shards_[s].cursor);
      }
    if (ids.empty()) return false;
    std::vector<DumpResponse> pages = client_.dump_round(ids, from, max_bytes_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Shard& sh = shards_[ids[i]];
      DumpResponse& p = pages[i];
      sh.done = p.done();
      sh.cursor = PageCursor{p.next_partition(), p.next_after_key_set(), p.next_after_key()};
      if (!p.keys().empty()) ready_.push_back(page_rows(p, client_.dim()));
      p.Clear();  // one copy of the page at a time
    }
  }
  *page = std::move(ready_.front());
  ready_.erase(ready_.begin());
  return true;
}

std::unique_ptr<DumpPager> PsClient::dump_pages(uint64_t max_bytes) {
  return std::make_unique<DumpPager>(*this, max_bytes);
}

TableDump PsClient::dump(uint64_t max_bytes) {
  DumpPager pager(*this, max_bytes);
  TableDump all, page;
  while (pager.next(&page)) {
    append(all.keys, page.keys);
    append(all.values, page.values);
    append(all.state, page.state);
  }
  // Pages come in partition order: one sort by key over every shard's rows.
  const size_t n = all.keys.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return all.keys[a] < all.keys[b]; });
  const size_t dim = opts_.dim;
  TableDump out;
  out.keys.resize(n);
  out.state.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out.keys[i] = all.keys[order[i]];
    out.state[i] = all.state[order[i]];
  }
  std::vector<int64_t>().swap(all.keys);
  out.values.resize(n * dim);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(&out.values[i * dim], &all.values[order[i] * dim], dim * sizeof(float));
  return out;
}

}  // namespace cpu_dist::ps
