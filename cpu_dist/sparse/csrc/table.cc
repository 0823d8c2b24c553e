// ShardTable: slots, reads, the public update entry points and counters.  The tier moves and
// the update itself are in table_tiers.cc, checkpoint staging in table_load.cc.
#include "table.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "hashing.h"

namespace cpu_dist::ps {

namespace {
// Different from kPartitionSalt, and the stripe uses high bits while partitions use low ones.
constexpr uint64_t kStripeSalt = 0x2545F4914F6CDD1DULL;
constexpr uint64_t kSeenSalt = 0x9FB21C651E98DF25ULL;  // the doorkeeper's own hash
}  // namespace

std::string ShardTable::store_dir() const {
  // A name nobody else picks: the shard's prefix, the process, 64 random bits.
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrCat(tiers_.ssd_dir, "/", tiers_.ssd_name, "-", ::getpid(), "-",
                      absl::Hex(r, absl::kZeroPad16));
}

namespace {
ShardTableSpec flag_spec(uint32_t dim, uint64_t seed, float init_scale, RuleOptions rules) {
  ShardTableSpec s;
  s.dim = dim;
  s.seed = seed;
  s.init_scale = init_scale;
  s.admit_after = rules.admit_after;
  s.expire_after = rules.expire_after;
  s.flag_declared = true;
  return s;
}
}  // namespace

ShardTable::ShardTable(uint32_t dim, uint64_t seed, float init_scale, uint32_t num_stripes,
                       uint32_t max_blocks_per_stripe, TierOptions tiers, RuleOptions rules)
    : ShardTable(flag_spec(dim, seed, init_scale, rules), num_stripes, max_blocks_per_stripe,
                 std::move(tiers)) {}

ShardTable::ShardTable(ShardTableSpec spec, uint32_t num_stripes, uint32_t max_blocks_per_stripe,
                       TierOptions tiers)
    : spec_(std::move(spec)),
      dim_(spec_.dim),
      sw_(spec_.state_floats()),
      seed_(spec_.seed ^ spec_.salt()),
      init_scale_(spec_.init_scale),
      eps_(spec_.eps),
      max_blocks_(std::clamp<uint32_t>(max_blocks_per_stripe, 1u, 65536u)),
      slot_bytes_((size_t{dim_} + sw_) * sizeof(float) + 2 * sizeof(int64_t) + 1),
      tiers_(std::move(tiers)),
      stripes_(std::max(1u, num_stripes)),
      rules_(spec_.rules()),
      serial_(tiers_.memory_rows > 0 || !tiers_.ssd_dir.empty() || tiers_.budget ||
              rules_.active()),
      grows_ahead_(tiers_.memory_rows == 0 && tiers_.ssd_dir.empty() && !tiers_.budget),
      grow_ahead_(
          [this](size_t i, size_t block, Block& blk) { return file_spare(i, block, blk); }) {
  if (!tiers_.ssd_dir.empty()) {
    // Keyed by the table's salted partitions, values with its state width (tier_store.h).
    store_ = std::make_unique<TierStore>(store_dir(), dim_, spec_.salt(), sw_);
    if (tiers_.memory_rows > 0) {  // each stripe's share of the budget, at least one row
      const uint64_t S = stripes_.size();
      for (uint64_t s = 0; s < S; ++s) {
        Stripe& st = stripes_[s];
        st.cap = std::max<uint64_t>(1, tiers_.memory_rows / S + (s < tiers_.memory_rows % S));
        size_t bits = 64;
        while (bits < 4 * st.cap) bits <<= 1;
        st.seen.assign(bits / 64, 0);
      }
    }
  }
  if (tiers_.budget) tiers_.budget->attach(this);  // last: the table can serve
}

ShardTable::~ShardTable() {
  if (tiers_.budget) tiers_.budget->detach(this);
}

uint32_t ShardTable::stripe_of(int64_t key) const {
  return static_cast<uint32_t>((mix64(static_cast<uint64_t>(key) ^ kStripeSalt) >> 32) %
                               stripes_.size());
}

// A block of R slots: float rows[R][dim], float state[R][sw], int64 keys[R], int64 steps[R],
// uint8 flags[R] (R is even, so the int64 arrays are aligned).
float* ShardTable::row_ptr(const Slots& s, uint32_t slot) const {
  return reinterpret_cast<float*>(s.blocks[slot >> 16].get()) +
         static_cast<size_t>(slot & 0xFFFFu) * dim_;
}

float* ShardTable::state_ptr(const Slots& s, uint32_t slot) const {
  const size_t b = slot >> 16;
  return reinterpret_cast<float*>(s.blocks[b].get()) + size_t{block_rows(b)} * dim_ +
         static_cast<size_t>(slot & 0xFFFFu) * sw_;
}

int64_t* ShardTable::key_ptr(const Slots& s, uint32_t slot) const {
  const size_t b = slot >> 16, r = block_rows(b);
  return reinterpret_cast<int64_t*>(s.blocks[b].get() + r * (dim_ + sw_) * sizeof(float)) +
         (slot & 0xFFFFu);
}

int64_t* ShardTable::step_ptr(const Slots& s, uint32_t slot) const {
  const size_t b = slot >> 16, r = block_rows(b);
  return reinterpret_cast<int64_t*>(s.blocks[b].get() + r * (dim_ + sw_) * sizeof(float)) + r +
         (slot & 0xFFFFu);
}

uint8_t* ShardTable::flags_ptr(const Slots& s, uint32_t slot) const {
  const size_t b = slot >> 16, r = block_rows(b);
  return reinterpret_cast<uint8_t*>(s.blocks[b].get()) +
         r * ((dim_ + sw_) * sizeof(float) + 2 * sizeof(int64_t)) + (slot & 0xFFFFu);
}

void ShardTable::prefetch_slot(const Slots& s, uint32_t slot, bool state, bool meta,
                               bool update) const {
  // A read asks for the lines shared, an update for them owned (prefetchw).
  const auto lines = [update](const char* p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += kCacheLine) {
      if (update) {
        __builtin_prefetch(p + off, 1);
      } else {
        __builtin_prefetch(p + off, 0);
      }
    }
  };
  lines(reinterpret_cast<const char*>(row_ptr(s, slot)), size_t{dim_} * sizeof(float));
  if (state) lines(reinterpret_cast<const char*>(state_ptr(s, slot)), size_t{sw_} * sizeof(float));
  if (meta) {
    __builtin_prefetch(step_ptr(s, slot), 1);
    __builtin_prefetch(flags_ptr(s, slot), 1);
  }
}

void ShardTable::init_row(int64_t key, float* out) const {
  // Same arithmetic as cpu_dist::row_init(seed, salt, ...), with the per-row part computed once
  // (seed_ is the spec's seed ^ the table's salt).
  const uint64_t base = mix64(mix64(seed_) ^ static_cast<uint64_t>(key));
  for (uint32_t c = 0; c < dim_; ++c) {
    const uint64_t bits = mix64(base ^ static_cast<uint64_t>(c));
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    out[c] = (u * 2.0f - 1.0f) * init_scale_;
  }
}

uint32_t ShardTable::new_slot(Slots& s) const {
  if (s.blocks.empty() || s.used_in_last == block_rows(s.blocks.size() - 1)) {
    if (s.blocks.size() >= max_blocks_)  // the slot's block index would wrap
      throw TableFull(absl::StrCat("table stripe full: ", s.index.size(), " rows in ",
                                   s.blocks.size(), " blocks (the most a stripe holds)"));
    size_t total = 0;
    for (size_t b = 0; b <= s.blocks.size(); ++b) total += block_rows(b);
    s.free.reserve(total);  // so that release() never allocates
    Block b;
    if (!s.spare.empty()) {
      b = std::move(s.spare.back());
      s.spare.pop_back();
    } else {
      // malloc, not value-initialising new: untouched tails must not become resident.
      b.reset(static_cast<char*>(std::malloc(block_rows(s.blocks.size()) * slot_bytes_)));
      if (b == nullptr) throw std::bad_alloc();
    }
    s.blocks.push_back(std::move(b));  // owned before push_back can throw: no leak
    s.used_in_last = 0;
  }
  return (static_cast<uint32_t>(s.blocks.size() - 1) << 16) | s.used_in_last;
}

void ShardTable::grow_ahead(size_t i, Stripe& st) const {
  Slots& s = st.s;
  if (!grows_ahead_ || s.blocks.empty() || !s.spare.empty()) return;
  const size_t next = s.blocks.size(), rows = block_rows(next - 1);
  // Half full, with no freed slots to take first; asked once per block.
  if (next >= max_blocks_ || st.ahead_asked == next || 2 * s.used_in_last < rows ||
      s.free.size() >= rows / 2)
    return;
  st.ahead_asked = next;
  grow_ahead_.request(i, next, block_rows(next) * slot_bytes_);
}

bool ShardTable::file_spare(size_t i, size_t block, Block& blk) const {
  Stripe& st = stripes_[i];
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.ahead_asked == block) st.ahead_asked = SIZE_MAX;
  // Not if the stripe took that block meanwhile, or a load left spares (a load swaps Slots).
  if (st.s.blocks.size() != block || !st.s.spare.empty()) return false;
  st.s.spare.push_back(std::move(blk));
  return true;
}

uint32_t ShardTable::take_slot(Slots& s, int64_t key) const {
  const bool reuse = !s.free.empty();
  const uint32_t slot = reuse ? s.free.back() : new_slot(s);
  // may throw: then the slot stays free
  if (!s.index.try_emplace(key, slot).second) return kNoSlot;
  if (reuse) {
    s.free.pop_back();
  } else {
    ++s.used_in_last;
  }
  *key_ptr(s, slot) = key;
  *flags_ptr(s, slot) = kUsed;
  return slot;
}

void ShardTable::release(Slots& s, uint32_t slot) const {
  s.index.erase(*key_ptr(s, slot));
  *flags_ptr(s, slot) = 0;
  s.free.push_back(slot);  // capacity reserved by new_slot
}

uint32_t ShardTable::insert_first_touch(Slots& s, int64_t key) const {
  const uint32_t slot = take_slot(s, key);
  init_row(key, row_ptr(s, slot));
  std::fill_n(state_ptr(s, slot), sw_, 0.0f);
  *step_ptr(s, slot) = kNoStep;
  *flags_ptr(s, slot) |= kDirty | kRef;  // no SSD copy: an eviction must write it
  return slot;
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

size_t ShardTable::ssd_get_missing(const Slots& s, const int64_t* keys, const uint32_t* order,
                                   const std::vector<uint32_t>& missing,
                                   std::vector<int64_t>& mkeys, std::vector<char>& values,
                                   std::vector<uint8_t>& found) const {
  if (!store_ || s.ssd_keys <= s.copies) return 0;
  const size_t vb = store_->value_bytes();
  mkeys.resize(missing.size());
  for (size_t q = 0; q < missing.size(); ++q) mkeys[q] = keys[order[missing[q]]];
  values.resize(missing.size() * vb);
  store_->get(mkeys.data(), mkeys.size(), values.data(), &found);
  return vb;
}

void ShardTable::gather(const int64_t* keys, size_t n, void* out) const {
  gather_impl(keys, n, out, nullptr, nullptr, true);
}

void ShardTable::gather(const int64_t* keys, size_t n, void* out, void* state_out,
                        void* step_out) const {
  gather_impl(keys, n, out, state_out, step_out, true);
}

void ShardTable::read(const int64_t* keys, size_t n, void* out, void* state_out,
                      void* step_out) const {
  gather_impl(keys, n, out, state_out, step_out, false);
}

void ShardTable::gather_impl(const int64_t* keys, size_t n, void* out_bytes, void* state_bytes,
                             void* step_bytes, bool may_move) const {
  char* out = static_cast<char*>(out_bytes);
  char* state_out = static_cast<char*>(state_bytes);
  char* step_out = static_cast<char*>(step_bytes);
  std::vector<uint32_t> order, starts;
  group_by_stripe(keys, n, order, starts);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  const bool moving = may_move && store_ && frozen_.load() == 0;
  const size_t state_len = size_t{sw_} * sizeof(float);
  // state: sw_ floats (null: zeros, a first-touch row's)
  const auto put_meta = [&](size_t i, const float* state, int64_t step) {
    if (state_out != nullptr) {
      if (state != nullptr) {
        std::memcpy(state_out + i * state_len, state, state_len);
      } else {
        std::memset(state_out + i * state_len, 0, state_len);  // 0.0f is all zero bits
      }
    }
    if (step_out != nullptr) std::memcpy(step_out + i * sizeof(step), &step, sizeof(step));
  };
  // Two passes per stripe: look every key up first (independent index probes overlap in the
  // CPU), then copy rows with the next rows prefetched, so row cache misses overlap too.
  std::vector<uint32_t> slot(n);
  std::vector<const float*> src(n);
  std::vector<uint32_t> missing;
  std::vector<int64_t> mkeys;
  std::vector<char> values;
  std::vector<uint8_t> found;
  std::vector<float> fresh, ssd_state;
  const bool with_meta = step_out != nullptr || moving;
  bool first = true;
  for (size_t s = 0; s < stripes_.size(); ++s) {
    if (starts[s] == starts[s + 1]) continue;
    if (hooks_ != nullptr && may_move && !std::exchange(first, false))
      hooks_->reach(TestPoint::kPullBetweenStripes);
    Stripe& st = stripes_[s];
    std::lock_guard<std::mutex> lock(st.mu);
    const uint32_t end = starts[s + 1];
    for (uint32_t j = starts[s]; j < end; ++j) {
      if (j + kPrefetchAhead < end) st.s.index.prefetch(keys[order[j + kPrefetchAhead]]);
      const uint32_t i = order[j];
      auto it = st.s.index.find(keys[i]);
      src[j] = it != st.s.index.end() ? row_ptr(st.s, slot[j] = it->second) : nullptr;
      if (src[j] != nullptr) __builtin_prefetch(src[j]);
    }
    for (uint32_t j = starts[s]; j < end; ++j) {
      if (j + kPrefetchAhead < end && src[j + kPrefetchAhead] != nullptr)
        prefetch_slot(st.s, slot[j + kPrefetchAhead], state_out != nullptr, with_meta, false);
      const uint32_t i = order[j];
      if (src[j] == nullptr) {
        missing.push_back(j);
        continue;
      }
      std::memcpy(out + size_t{i} * row_bytes, src[j], row_bytes);
      if (state_out != nullptr || step_out != nullptr)
        put_meta(i, state_ptr(st.s, slot[j]), *step_ptr(st.s, slot[j]));
      if (moving) *flags_ptr(st.s, slot[j]) |= kRef;
    }
    if (missing.empty()) continue;
    // Rows not in DRAM: from the SSD tier when it holds rows of this stripe, else first-touch.
    const size_t vb = ssd_get_missing(st.s, keys, order.data(), missing, mkeys, values, found);
    const bool ssd = vb > 0;
    size_t hits = 0;
    for (size_t q = 0; q < missing.size(); ++q) {
      const uint32_t i = order[missing[q]];
      float* dst = reinterpret_cast<float*>(out + size_t{i} * row_bytes);
      if (ssd && found[q]) {
        int64_t step;
        ssd_state.resize(sw_);
        store_->decode_value(&values[q * vb], nullptr, ssd_state.data(), &step);
        std::memcpy(dst, &values[q * vb], row_bytes);
        put_meta(i, ssd_state.data(), step);
        ++hits;
      } else {
        fresh.resize(dim_);
        init_row(keys[i], fresh.data());
        std::memcpy(dst, fresh.data(), row_bytes);
        put_meta(i, nullptr, kNoStep);
      }
    }
    if (hits > 0) rows_read_ssd_.fetch_add(hits, std::memory_order_relaxed);
    if (moving && hits > 0) {
      // Rows read from SSD for the second time come into DRAM as clean copies (a Zipf tail
      // read once does not push hot rows out); an optimisation only: the rows are served.
      size_t admit = 0;
      for (size_t q = 0; q < missing.size(); ++q) {
        if (found[q] && !seen_before(st, mkeys[q])) found[q] = 0;
        admit += found[q];
      }
      try {
        const uint64_t room = std::min<uint64_t>(admit, st.cap);
        if (room > 0 && st.s.index.size() + room > st.cap) evict_to(st.s, st.cap - room);
        uint64_t moved = 0;
        for (size_t q = 0; q < missing.size() && moved < room; ++q)
          if (found[q] && !st.s.index.contains(mkeys[q])) {
            promote(st.s, mkeys[q], &values[q * vb]);
            ++moved;
          }
      } catch (const std::exception&) {
      }
    }
    missing.clear();
  }
}

void ShardTable::apply(const int64_t* keys, const float* grads, size_t n, float lr,
                       OptimizerKind opt, bool wait) {
  PushLock writer = push_lock();
  writer.lock(wait);  // waits while frozen
  const std::optional<TierError> after = apply_locked(keys, grads, n, lr, opt, nullptr);
  if (after)
    throw AppliedThenFailed(absl::StrCat("the push was applied, then the SSD tier failed evicting "
                                         "its rows (the DRAM tier is over its budget): ",
                                         after->what()),
                            after->no_space());
}

bool ShardTable::seen_before(Stripe& st, int64_t key) {
  if (st.seen.empty()) return true;
  const uint64_t bit = mix64(static_cast<uint64_t>(key) ^ kSeenSalt) & (st.seen.size() * 64 - 1);
  uint64_t& word = st.seen[bit >> 6];
  const uint64_t mask = uint64_t{1} << (bit & 63);
  if (word & mask) return true;
  word |= mask;
  if (++st.seen_marked >= st.cap) {  // a new window
    std::fill(st.seen.begin(), st.seen.end(), 0);
    st.seen_marked = 0;
  }
  return false;
}

std::unique_ptr<TierStore::Cursor> ShardTable::ssd_cursor(uint32_t end_partition, bool bulk) const {
  if (!store_) return nullptr;
  return std::make_unique<TierStore::Cursor>(*store_, end_partition, bulk);
}

uint64_t ShardTable::rows() const {
  uint64_t n = 0;
  for (const auto& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    n += st.s.index.size() + (st.s.ssd_keys - st.s.copies);
  }
  return n;
}

uint64_t ShardTable::bytes() const {
  uint64_t b = 0;
  for (const auto& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    b += st.s.index.capacity() * (sizeof(std::pair<int64_t, uint32_t>) + 1);
    b += st.s.free.capacity() * sizeof(uint32_t);
    for (size_t i = 0; i < st.s.blocks.size() + st.s.spare.size(); ++i)  // spares: the next
      b += static_cast<uint64_t>(block_rows(i)) * slot_bytes_;
  }
  return b;
}

TierStats ShardTable::tier_stats() const {
  TierStats t;
  for (const auto& st : stripes_) {
    std::lock_guard<std::mutex> lock(st.mu);
    t.rows_dram += st.s.index.size();
    t.rows_ssd += st.s.ssd_keys - st.s.copies;
  }
  t.ssd_bytes = store_ ? store_->live_bytes() : 0;
  t.rows_admitted = rows_admitted_.load();
  t.rows_expired = rows_expired_.load();
  t.pending_counts = pending_counts_.load();
  t.rows_read_ssd = rows_read_ssd_.load();
  t.blocks_ahead = grow_ahead_.filed();
  return t;
}

}  // namespace cpu_dist::ps
