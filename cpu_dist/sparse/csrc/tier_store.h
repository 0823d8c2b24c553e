// The SSD tier of one shard: rows in a RocksDB of their own, working storage of the running
// shard (checkpoints stay the durable form).  The store lives in a fresh directory that it
// creates and removes with everything in it when it is destroyed; writes skip the WAL and never
// fsync (a crashed shard restarts from a checkpoint, never from this store).
//
// One store per table of a shard (each ShardTable owns its own, in a directory of its own):
// the shard's DRAM budget is shared by its tables (memory_budget.h), their SSD tiers are not.
//
// Key layout: 12 bytes, uint32 partition (hashing.h, salted with the table's salt) then the
// int64 key with its sign bit flipped, both big-endian, so that the bytewise order is
// (partition, key): a checkpoint, which is grouped by the table's partitions with keys
// ascending, is a merge of this order with the DRAM rows, a Dump page is a range scan, and a
// load appends sorted SST files.
// Value: float32 values[dim], float32 state[state_floats] (1: SGD, row-wise Adagrad; dim:
// Adagrad), int64 last-update step (row_meta.h), little-endian.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace rocksdb {
class DB;
class Iterator;
class Slice;
class SstFileWriter;
class WriteBatch;
}  // namespace rocksdb

namespace cpu_dist::ps {

// A RocksDB call that failed (a full or failing disk); no_space: out of disk space.
class TierError : public std::runtime_error {
 public:
  TierError(const std::string& msg, bool no_space) : std::runtime_error(msg), no_space_(no_space) {}
  bool no_space() const { return no_space_; }

 private:
  bool no_space_;
};

class TierStore {
 public:
  static constexpr size_t kKeyBytes = 12;

  // Creates `dir` (it must not exist; parents are created) and a RocksDB in it.  `salt`: the
  // table's (hashing.h table_salt; 0 for the default table), `state_floats`: its optimizer
  // state's width.
  TierStore(std::string dir, uint32_t dim, uint64_t salt = 0, uint32_t state_floats = 1);
  ~TierStore();  // closes the database and removes `dir`
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  const std::string& dir() const { return dir_; }
  size_t value_bytes() const {
    return (size_t{dim_} + state_floats_) * sizeof(float) + sizeof(int64_t);
  }
  void encode_key(int64_t key, char* out) const;
  static int64_t decode_key(const char* in, uint32_t* partition);
  // state: state_floats floats.
  void encode_value(const float* row, const float* state, int64_t step, char* out) const;
  // Any output may be null; state gets state_floats floats.
  void decode_value(const char* in, float* row, float* state, int64_t* step) const;

  // Point reads: for each key, found[i] and, when found, its value at values + i * value_bytes().
  void get(const int64_t* keys, size_t n, char* values, std::vector<uint8_t>* found) const;

  // Puts and deletes applied together by write().
  class Batch {
   public:
    explicit Batch(const TierStore& store);
    ~Batch();
    void put(int64_t key, const float* row, const float* state, int64_t step);
    void put(int64_t key, const float* row, float state, int64_t step) {  // state_floats 1
      put(key, row, &state, step);
    }
    void del(int64_t key);
    size_t size() const { return ops_; }

   private:
    friend class TierStore;
    const TierStore& store_;
    std::unique_ptr<rocksdb::WriteBatch> wb_;
    std::string value_;
    size_t ops_ = 0;
  };
  void write(Batch& b);  // all or nothing; throws TierError

  // Rows in (partition, key) order, from a start to an end partition (exclusive).
  class Cursor {
   public:
    Cursor(const TierStore& store, uint32_t end_partition, bool bulk);
    ~Cursor();
    // The first row of `partition` or a later one; with after_key_set, within `partition` only
    // keys after `after_key`.
    void seek(uint32_t partition, bool after_key_set, int64_t after_key);
    bool valid() const;
    void next();
    int64_t key() const;  // of the current row
    uint32_t partition() const;
    const char* value() const;  // value_bytes() bytes

   private:
    std::string upper_;  // the upper bound's bytes, alive as long as the iterator
    std::unique_ptr<rocksdb::Slice> bound_;
    std::unique_ptr<rocksdb::Iterator> it_;
    const TierStore& store_;
  };

  // Bulk load into a store nothing has been written to: rows in strictly ascending (partition,
  // key) order go into SST files, which finish() ingests; nothing is visible before.
  class BulkLoader {
   public:
    explicit BulkLoader(TierStore& store);
    ~BulkLoader();
    void add(int64_t key, const float* row, const float* state, int64_t step);
    void add(int64_t key, const float* row, float state, int64_t step) {  // state_floats 1
      add(key, row, &state, step);
    }
    void finish();
    uint64_t rows() const { return rows_; }

   private:
    void roll();  // closes the current file
    TierStore& store_;
    std::unique_ptr<rocksdb::SstFileWriter> w_;
    std::vector<std::string> files_;
    std::string value_;
    uint64_t rows_ = 0, in_file_ = 0;
  };

  // RocksDB's estimate of its live data, in bytes.
  uint64_t live_bytes() const;
  // Writes the memtables to SST files (benchmarks measure what is on disk).
  void flush();

 private:
  const std::string dir_;
  const uint32_t dim_;
  const uint64_t salt_;
  const uint32_t state_floats_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace cpu_dist::ps
