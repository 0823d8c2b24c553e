#include "table.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "hashing.h"

namespace cpu_dist::ps {

namespace {
// Different from kPartitionSalt, and the stripe uses high bits while partitions use low ones.
constexpr uint64_t kStripeSalt = 0x2545F4914F6CDD1DULL;
}  // namespace

ShardTable::ShardTable(uint32_t dim, uint64_t seed, float init_scale, uint32_t num_stripes,
                       uint32_t max_blocks_per_stripe)
    : dim_(dim),
      seed_(seed),
      init_scale_(init_scale),
      max_blocks_(std::clamp<uint32_t>(max_blocks_per_stripe, 1u, 65536u)),
      stripes_(std::max(1u, num_stripes)) {}

uint32_t ShardTable::stripe_of(int64_t key) const {
  return static_cast<uint32_t>((mix64(static_cast<uint64_t>(key) ^ kStripeSalt) >> 32) %
                               stripes_.size());
}

float* ShardTable::row_ptr(const Stripe& s, uint32_t slot) const {
  return s.blocks[slot >> 16].get() + static_cast<size_t>(slot & 0xFFFFu) * dim_;
}

float* ShardTable::state_ptr(const Stripe& s, uint32_t slot) const {
  const size_t b = slot >> 16;
  return s.blocks[b].get() + static_cast<size_t>(block_rows(b)) * dim_ + (slot & 0xFFFFu);
}

void ShardTable::init_row(int64_t key, float* out) const {
  // Same arithmetic as cpu_dist::row_init, with the per-row part computed once.
  const uint64_t base = mix64(mix64(seed_) ^ static_cast<uint64_t>(key));
  for (uint32_t c = 0; c < dim_; ++c) {
    const uint64_t bits = mix64(base ^ static_cast<uint64_t>(c));
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    out[c] = (u * 2.0f - 1.0f) * init_scale_;
  }
}

uint32_t ShardTable::insert_row(Stripe& s, int64_t key) {
  const uint32_t slot = free_slot(s);
  s.index.emplace(key, slot);  // may throw: then the slot stays free
  ++s.used_in_last;
  init_row(key, row_ptr(s, slot));
  *state_ptr(s, slot) = 0.0f;
  return slot;
}

uint32_t ShardTable::free_slot(Stripe& s) const {
  if (s.blocks.empty() || s.used_in_last == block_rows(s.blocks.size() - 1)) {
    if (s.blocks.size() >= max_blocks_)  // the slot's block index would wrap
      throw TableFull(absl::StrCat("table stripe full: ", s.index.size(), " rows in ",
                                   s.blocks.size(), " blocks (the most a stripe holds)"));
    const size_t rows = block_rows(s.blocks.size());
    // malloc, not value-initialising new: untouched tails must not become resident.
    Block b(static_cast<float*>(std::malloc(rows * (dim_ + 1) * sizeof(float))));
    if (b == nullptr) throw std::bad_alloc();
    s.blocks.push_back(std::move(b));  // owned before push_back can throw: no leak
    s.used_in_last = 0;
  }
  return (static_cast<uint32_t>(s.blocks.size() - 1) << 16) | s.used_in_last;
}

void ShardTable::group_by_stripe(const int64_t* keys, size_t n, std::vector<uint32_t>& order,
                                 std::vector<uint32_t>& starts) const {
  const size_t ns = stripes_.size();
  std::vector<uint32_t> sid(n);
  starts.assign(ns + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    sid[i] = stripe_of(keys[i]);
    ++starts[sid[i] + 1];
  }
  for (size_t s = 0; s < ns; ++s) starts[s + 1] += starts[s];
  std::vector<uint32_t> pos(starts.begin(), starts.end() - 1);
  order.resize(n);
  for (size_t i = 0; i < n; ++i) order[pos[sid[i]]++] = static_cast<uint32_t>(i);
}

void ShardTable::gather(const int64_t* keys, size_t n, void* out_bytes, void* state_bytes) const {
  char* out = static_cast<char*>(out_bytes);
  char* state_out = static_cast<char*>(state_bytes);
  std::vector<float> fresh(dim_);
  std::vector<uint32_t> order, starts;
  group_by_stripe(keys, n, order, starts);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  // Two passes per stripe: look every key up first (independent index probes overlap in the
  // CPU), then copy rows with the next rows prefetched, so row cache misses overlap too.
  std::vector<uint32_t> slot(n);
  std::vector<const float*> src(n);
  constexpr size_t kAhead = 8;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    const Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      const uint32_t i = order[j];
      auto it = st.index.find(keys[i]);
      src[j] = it != st.index.end() ? row_ptr(st, slot[j] = it->second) : nullptr;
      if (src[j] != nullptr) __builtin_prefetch(src[j]);
    }
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      if (j + kAhead < starts[s + 1] && src[j + kAhead] != nullptr) {
        const char* ahead = reinterpret_cast<const char*>(src[j + kAhead]);
        for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(ahead + off);
      }
      const uint32_t i = order[j];
      char* dst = out + static_cast<size_t>(i) * row_bytes;
      float state = 0.0f;
      if (src[j] != nullptr) {
        std::memcpy(dst, src[j], row_bytes);
        state = *state_ptr(st, slot[j]);
      } else {
        init_row(keys[i], fresh.data());
        std::memcpy(dst, fresh.data(), row_bytes);
      }
      if (state_out != nullptr) std::memcpy(state_out + size_t{i} * sizeof(float), &state, 4);
    }
  }
}

void ShardTable::apply(const int64_t* keys, const float* grads, size_t n, float lr,
                       OptimizerKind opt) {
  std::shared_lock<std::shared_mutex> writer(update_mu_);  // waits while frozen
  std::vector<uint32_t> order, starts;
  group_by_stripe(keys, n, order, starts);
  // Pass 1 (may throw): find or insert every row.  Slots never move, so they stay valid.
  std::vector<uint32_t> slots(n);
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      const int64_t key = keys[order[j]];
      auto it = st.index.find(key);
      slots[j] = it != st.index.end() ? it->second : insert_row(st, key);
    }
  }
  // Pass 2 (cannot throw): update.
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j)
      apply_row(opt, lr, grads + static_cast<size_t>(order[j]) * dim_, row_ptr(st, slots[j]),
                state_ptr(st, slots[j]), dim_);
  }
}

std::unique_ptr<ShardTable::Staged> ShardTable::new_staged(size_t expected_rows) const {
  auto st = std::make_unique<Staged>(stripes_.size());
  const size_t per = expected_rows / stripes_.size();
  for (Stripe& s : st->stripes) s.index.reserve(per + per / 16 + 16);
  return st;
}

void ShardTable::stage_rows(Staged& staged, const int64_t* keys, const float* values,
                            const float* state, size_t n) const {
  // One stripe at a time: its index stays in cache while it grows.
  std::vector<uint32_t> order, starts;
  group_by_stripe(keys, n, order, starts);
  constexpr size_t kAhead = 8;
  for (size_t s = 0; s < staged.stripes.size(); ++s) {
    Stripe& st = staged.stripes[s];
    for (uint32_t j = starts[s]; j < starts[s + 1]; ++j) {
      if (j + kAhead < starts[s + 1]) __builtin_prefetch(values + size_t{order[j + kAhead]} * dim_);
      const size_t i = order[j];
      const uint32_t slot = free_slot(st);
      if (!st.index.emplace(keys[i], slot).second)
        throw std::invalid_argument(absl::StrCat("duplicate key ", keys[i]));
      ++st.used_in_last;
      std::memcpy(row_ptr(st, slot), values + i * dim_, dim_ * sizeof(float));
      *state_ptr(st, slot) = state[i];
    }
  }
  staged.rows += n;
}

void ShardTable::adopt(Staged& staged) {
  std::unique_lock<std::shared_mutex> writer(update_mu_);
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(stripes_.size());
  for (auto& st : stripes_) locks.emplace_back(st.mu);
  size_t old_rows = 0;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    old_rows += stripes_[s].index.size();
    std::swap(stripes_[s].index, staged.stripes[s].index);
    std::swap(stripes_[s].blocks, staged.stripes[s].blocks);
    std::swap(stripes_[s].used_in_last, staged.stripes[s].used_in_last);
  }
  staged.rows = old_rows;
}

uint64_t ShardTable::rows() const {
  uint64_t n = 0;
  for (const auto& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    n += st.index.size();
  }
  return n;
}

uint64_t ShardTable::bytes() const {
  uint64_t b = 0;
  for (const auto& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    b += st.index.capacity() * (sizeof(std::pair<int64_t, uint32_t>) + 1);
    for (size_t i = 0; i < st.blocks.size(); ++i)
      b += static_cast<uint64_t>(block_rows(i)) * (dim_ + 1) * sizeof(float);
  }
  return b;
}

}  // namespace cpu_dist::ps
