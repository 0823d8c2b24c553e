// PsClient: dumps in pages.  Every shard is asked for its next page at once (dump_round, in
// client_admin.cc); dump() assembles every page into one key-sorted result, DumpPager hands
// the pages out one at a time for streaming writers.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "client.h"

namespace cpu_dist::ps {

namespace {

// A page's rows (sorted by key by the shard), copied out of the reply; its state floats per
// row (1, or dim: dump_round checked it is one of them) from the state's size.
DumpRows page_rows(const DumpResponse& p, uint32_t dim) {
  const size_t n = p.keys().size() / sizeof(int64_t);
  DumpRows d;
  d.keys.resize(n);
  d.values.resize(n * dim);
  if (n == 0) return d;
  d.state_width = static_cast<uint32_t>(p.state().size() / (n * sizeof(float)));
  d.state.resize(n * d.state_width);
  std::memcpy(d.keys.data(), p.keys().data(), n * sizeof(int64_t));
  std::memcpy(d.values.data(), p.values().data(), n * dim * sizeof(float));
  std::memcpy(d.state.data(), p.state().data(), d.state.size() * sizeof(float));
  return d;
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

DumpPager::DumpPager(PsClient& client, uint64_t max_bytes, uint32_t table)
    : client_(client), max_bytes_(max_bytes), table_(table), shards_(client.num_shards()) {
  if (table >= client.tables().size())
    throw std::invalid_argument("dump: table index " + std::to_string(table) + " out of range");
}

bool DumpPager::next(DumpRows* page) {
  while (ready_.empty()) {
    std::vector<uint32_t> ids;
    std::vector<PageCursor> from;
    for (uint32_t s = 0; s < shards_.size(); ++s)
      if (!shards_[s].done) {
        ids.push_back(s);
        from.push_back(shards_[s].cursor);
      }
    if (ids.empty()) return false;
    std::vector<DumpResponse> pages = client_.dump_round(ids, from, max_bytes_, table_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Shard& sh = shards_[ids[i]];
      DumpResponse& p = pages[i];
      sh.done = p.done();
      sh.cursor = PageCursor{p.next_partition(), p.next_after_key_set(), p.next_after_key()};
      if (!p.keys().empty()) ready_.push_back(page_rows(p, client_.tables()[table_].dim));
      p.Clear();  // one copy of the page at a time
    }
  }
  *page = std::move(ready_.front());
  ready_.erase(ready_.begin());
  return true;
}

std::unique_ptr<DumpPager> PsClient::dump_pages(uint64_t max_bytes, std::optional<uint32_t> table) {
  return std::make_unique<DumpPager>(*this, max_bytes, table.value_or(*table_index(opts_.table)));
}

DumpRows PsClient::dump(uint64_t max_bytes, std::optional<uint32_t> table) {
  const uint32_t t = table.value_or(*table_index(opts_.table));
  DumpPager pager(*this, max_bytes, t);
  DumpRows all, page;
  while (pager.next(&page)) {
    if (!all.keys.empty() && page.state_width != all.state_width)
      throw RpcError("dump of table '" + opts_.tables[t].name +
                     "': pages with different optimizer states");
    all.state_width = page.state_width;
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
  const size_t dim = opts_.tables[t].dim;
  const size_t w = all.state_width;
  DumpRows out;
  out.state_width = all.state_width;
  out.keys.resize(n);
  out.state.resize(n * w);
  for (size_t i = 0; i < n; ++i) {
    out.keys[i] = all.keys[order[i]];
    std::memcpy(&out.state[i * w], &all.state[order[i] * w], w * sizeof(float));
  }
  std::vector<int64_t>().swap(all.keys);
  out.values.resize(n * dim);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(&out.values[i * dim], &all.values[order[i] * dim], dim * sizeof(float));
  return out;
}

}  // namespace cpu_dist::ps
