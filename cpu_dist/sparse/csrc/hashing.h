// The two hash contracts of cpu_dist, shared by server and client.  Their Python twins
// live in cpu_dist/common/contracts.py and are tested against these bit for bit.
//
//  mix64(x)            : the splitmix64 finalizer (Steele, Lea, Flood 2014).
//  row_init(seed,k,c,s): first-touch value of column c of row k.
//                        bits = mix64(mix64(mix64(seed) ^ k) ^ c)
//                        u    = float32(bits >> 40) * 2^-24        (exact, in [0, 1))
//                        v    = (u * 2 - 1) * s                    (one float32 rounding)
//  partition_of(k)     : mix64(k ^ kPartitionSalt) % kNumPartitions
//  shard_of(k, P)      : partition_of(k) % P
// A fixed number of partitions lets a checkpoint written by P shards be loaded by P'.
//
// Tables.  Each named table keys both contracts by its salt, so that key k of two tables is
// two rows on (usually) two shards:
//  table_salt(name)    : 0 for kDefaultTable ("embedding", the one table of a job without a
//                        job file: today's functions bit for bit), else mix64(fnv1a64(name))
//  row_init(seed,salt,k,c,s) = row_init(seed ^ salt, k, c, s)
//  partition_of(k,salt)      = partition_of(k ^ salt)
#pragma once

#include <cstdint>
#include <string_view>

namespace cpu_dist {

inline constexpr uint32_t kNumPartitions = 4096;
inline constexpr uint64_t kPartitionSalt = 0x5bd1e9955bd1e995ULL;

inline constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline float row_init(uint64_t seed, int64_t key, uint32_t column, float scale) {
  const uint64_t bits =
      mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(key)) ^ static_cast<uint64_t>(column));
  const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
  const float centered = u * 2.0f - 1.0f;  // exact: no rounding happens here
  return centered * scale;
}

inline uint32_t partition_of(int64_t key) {
  return static_cast<uint32_t>(mix64(static_cast<uint64_t>(key) ^ kPartitionSalt) % kNumPartitions);
}

inline uint32_t shard_of(int64_t key, uint32_t num_shards) {
  return partition_of(key) % num_shards;
}

inline constexpr std::string_view kDefaultTable = "embedding";

inline constexpr uint64_t table_salt(std::string_view name) {
  if (name == kDefaultTable) return 0;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bit
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return mix64(h);
}

inline float row_init(uint64_t seed, uint64_t salt, int64_t key, uint32_t column, float scale) {
  return row_init(seed ^ salt, key, column, scale);
}

inline uint32_t partition_of(int64_t key, uint64_t salt) {
  return partition_of(static_cast<int64_t>(static_cast<uint64_t>(key) ^ salt));
}

inline uint32_t shard_of(int64_t key, uint64_t salt, uint32_t num_shards) {
  return partition_of(key, salt) % num_shards;
}

}  // namespace cpu_dist
