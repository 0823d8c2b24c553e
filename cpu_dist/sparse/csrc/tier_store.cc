#include "tier_store.h"

#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "hashing.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/perf_level.h"
#include "rocksdb/slice.h"
#include "rocksdb/slice_transform.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace cpu_dist::ps {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSignFlip = 1ull << 63;
constexpr uint64_t kRowsPerSstFile = 1u << 20;  // about 280 MB at dim 64

void check(const rocksdb::Status& s, const std::string& what, const std::string& dir) {
  if (s.ok()) return;
  throw TierError(absl::StrCat("SSD tier ", dir, ": ", what, " failed: ", s.ToString()),
                  s.IsNoSpace());
}

void put_be32(uint32_t v, char* out) {
  for (int i = 3; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xFF);
}

void put_be64(uint64_t v, char* out) {
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xFF);
}

uint64_t get_be(const char* in, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

// Tuned for a working store of rows: point reads (a Bloom filter per file, so a key that is
// not there costs no disk read), no compression (float rows do not compress), level compaction
// with dynamic level sizes (space amplification about 1.1), both cores for background work.
rocksdb::Options store_options() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = true;
  o.compression = rocksdb::kNoCompression;
  o.bottommost_compression = rocksdb::kNoCompression;
  o.max_background_jobs = 2;
  o.write_buffer_size = 64ull << 20;
  o.max_write_buffer_number = 3;
  o.target_file_size_base = 64ull << 20;
  o.max_bytes_for_level_base = 512ull << 20;
  o.level_compaction_dynamic_level_bytes = true;
  o.max_open_files = -1;
  o.keep_log_file_num = 1;
  o.max_manifest_file_size = 64ull << 20;
  // Most lookups are of rows that are not in the memtable: a Bloom filter there skips its
  // skip list.
  o.memtable_whole_key_filtering = true;
  o.memtable_prefix_bloom_size_ratio = 0.05;
  // Blocks straight from the page cache (no read call, no copy, no block cache to fill).
  o.allow_mmap_reads = true;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_size = 4096;
  t.block_restart_interval = 4;  // a point read parses at most 4 entries after the hash hit
  t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  t.no_block_cache = true;  // the page cache is the cache (mmap reads)
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

rocksdb::WriteOptions write_options() {
  rocksdb::WriteOptions w;
  w.disableWAL = true;  // working storage: a crashed shard restarts from a checkpoint
  w.sync = false;
  return w;
}

}  // namespace

TierStore::TierStore(std::string dir, uint32_t dim, uint64_t salt, uint32_t state_floats)
    : dir_(std::move(dir)), dim_(dim), salt_(salt), state_floats_(state_floats) {
  std::error_code ec;
  if (fs::exists(dir_, ec))
    throw TierError(absl::StrCat("SSD tier ", dir_, ": already exists"), false);
  fs::create_directories(fs::path(dir_).parent_path(), ec);
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(store_options(), dir_, &db);
  if (!s.ok()) {
    fs::remove_all(dir_, ec);
    check(s, "open", dir_);
  }
  db_.reset(db);
}

TierStore::~TierStore() {
  db_.reset();  // closes, then the files can go
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void TierStore::encode_key(int64_t key, char* out) const {
  put_be32(partition_of(key, salt_), out);
  put_be64(static_cast<uint64_t>(key) ^ kSignFlip, out + 4);
}

int64_t TierStore::decode_key(const char* in, uint32_t* partition) {
  if (partition != nullptr) *partition = static_cast<uint32_t>(get_be(in, 4));
  return static_cast<int64_t>(get_be(in + 4, 8) ^ kSignFlip);
}

void TierStore::encode_value(const float* row, const float* state, int64_t step, char* out) const {
  const size_t rb = size_t{dim_} * sizeof(float), sb = size_t{state_floats_} * sizeof(float);
  std::memcpy(out, row, rb);
  std::memcpy(out + rb, state, sb);
  std::memcpy(out + rb + sb, &step, sizeof(step));
}

void TierStore::decode_value(const char* in, float* row, float* state, int64_t* step) const {
  const size_t rb = size_t{dim_} * sizeof(float), sb = size_t{state_floats_} * sizeof(float);
  if (row != nullptr) std::memcpy(row, in, rb);
  if (state != nullptr) std::memcpy(state, in + rb, sb);
  if (step != nullptr) std::memcpy(step, in + rb + sb, sizeof(int64_t));
}

void TierStore::get(const int64_t* keys, size_t n, char* values,
                    std::vector<uint8_t>* found) const {
  found->assign(n, 0);
  if (n == 0) return;
  std::vector<char> kb(n * kKeyBytes);
  std::vector<rocksdb::Slice> ks(n);
  for (size_t i = 0; i < n; ++i) {
    encode_key(keys[i], &kb[i * kKeyBytes]);
    ks[i] = rocksdb::Slice(&kb[i * kKeyBytes], kKeyBytes);
  }
  std::vector<rocksdb::PinnableSlice> vs(n);
  std::vector<rocksdb::Status> st(n);
  rocksdb::SetPerfLevel(rocksdb::PerfLevel::kDisable);  // per thread: no counters per read
  rocksdb::ReadOptions ro;
  ro.verify_checksums = false;  // working storage on a local disk; a pull reads ~8 blocks a row
  db_->MultiGet(ro, db_->DefaultColumnFamily(), n, ks.data(), vs.data(), st.data());
  const size_t vb = value_bytes();
  for (size_t i = 0; i < n; ++i) {
    if (st[i].IsNotFound()) continue;
    check(st[i], "read", dir_);
    if (vs[i].size() != vb)
      throw TierError(absl::StrCat("SSD tier ", dir_, ": key ", keys[i], " holds ", vs[i].size(),
                                   " bytes, not ", vb),
                      false);
    std::memcpy(values + i * vb, vs[i].data(), vb);
    (*found)[i] = 1;
  }
}

TierStore::Batch::Batch(const TierStore& store)
    : store_(store), wb_(std::make_unique<rocksdb::WriteBatch>()), value_(store.value_bytes(), 0) {}

TierStore::Batch::~Batch() = default;

void TierStore::Batch::put(int64_t key, const float* row, const float* state, int64_t step) {
  char k[kKeyBytes];
  store_.encode_key(key, k);
  store_.encode_value(row, state, step, value_.data());
  wb_->Put(rocksdb::Slice(k, kKeyBytes), rocksdb::Slice(value_));
  ++ops_;
}

void TierStore::Batch::del(int64_t key) {
  char k[kKeyBytes];
  store_.encode_key(key, k);
  wb_->Delete(rocksdb::Slice(k, kKeyBytes));
  ++ops_;
}

void TierStore::write(Batch& b) {
  if (b.ops_ == 0) return;
  check(db_->Write(write_options(), b.wb_.get()), "write", dir_);
}

TierStore::Cursor::Cursor(const TierStore& store, uint32_t end_partition, bool bulk)
    : store_(store) {
  upper_.resize(4);
  put_be32(end_partition, upper_.data());
  bound_ = std::make_unique<rocksdb::Slice>(upper_.data(), upper_.size());
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = bound_.get();  // no block past the range is read
  ro.total_order_seek = true;             // a range crosses partitions (prefixes)
  if (bulk) {  // a checkpoint or a dump reads on: read ahead, keep the block cache for pulls
    ro.readahead_size = 4ull << 20;
    ro.fill_cache = false;
  }
  it_.reset(store.db_->NewIterator(ro));
}

TierStore::Cursor::~Cursor() = default;

void TierStore::Cursor::seek(uint32_t partition, bool after_key_set, int64_t after_key) {
  char k[kKeyBytes];
  if (after_key_set) {
    store_.encode_key(after_key, k);
    put_be32(partition, k);  // the key's own partition is `partition` when the caller is right
    it_->Seek(rocksdb::Slice(k, kKeyBytes));
    if (it_->Valid() && it_->key() == rocksdb::Slice(k, kKeyBytes)) it_->Next();
  } else {
    put_be32(partition, k);
    it_->Seek(rocksdb::Slice(k, 4));
  }
}

bool TierStore::Cursor::valid() const {
  if (!it_->Valid()) {
    check(it_->status(), "scan", store_.dir_);
    return false;
  }
  return std::memcmp(it_->key().data(), upper_.data(), 4) < 0;
}

void TierStore::Cursor::next() { it_->Next(); }

int64_t TierStore::Cursor::key() const { return decode_key(it_->key().data(), nullptr); }

uint32_t TierStore::Cursor::partition() const {
  return static_cast<uint32_t>(get_be(it_->key().data(), 4));
}

const char* TierStore::Cursor::value() const { return it_->value().data(); }

TierStore::BulkLoader::BulkLoader(TierStore& store)
    : store_(store), value_(store.value_bytes(), 0) {}

TierStore::BulkLoader::~BulkLoader() {
  std::error_code ec;
  for (const std::string& f : files_) fs::remove(f, ec);  // left only when finish() did not run
}

void TierStore::BulkLoader::roll() {
  if (!w_) return;
  check(w_->Finish(), "bulk load (finish a file)", store_.dir_);
  w_.reset();
}

void TierStore::BulkLoader::add(int64_t key, const float* row, const float* state, int64_t step) {
  if (!w_ || in_file_ == kRowsPerSstFile) {
    roll();
    // invalidate_page_cache false: the rows just loaded are read next, leave them cached.
    w_ = std::make_unique<rocksdb::SstFileWriter>(rocksdb::EnvOptions(), store_options(), nullptr,
                                                  /*invalidate_page_cache=*/false);
    files_.push_back(absl::StrCat(store_.dir_, "/bulk-", files_.size(), ".sst"));
    check(w_->Open(files_.back()), "bulk load (open a file)", store_.dir_);
    in_file_ = 0;
  }
  char k[kKeyBytes];
  store_.encode_key(key, k);
  store_.encode_value(row, state, step, value_.data());
  check(w_->Put(rocksdb::Slice(k, kKeyBytes), rocksdb::Slice(value_)), "bulk load (add)",
        store_.dir_);
  ++in_file_;
  ++rows_;
}

void TierStore::BulkLoader::finish() {
  roll();
  if (files_.empty()) return;
  rocksdb::IngestExternalFileOptions io;
  io.move_files = true;
  check(store_.db_->IngestExternalFile(files_, io), "bulk load (ingest)", store_.dir_);
  files_.clear();
}

uint64_t TierStore::live_bytes() const {
  uint64_t v = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kEstimateLiveDataSize, &v);
  uint64_t mem = 0;
  db_->GetIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &mem);
  return v + mem;
}

void TierStore::flush() { check(db_->Flush(rocksdb::FlushOptions()), "flush", dir_); }

}  // namespace cpu_dist::ps
