// What a shard's table is (tables issue): its name, width, optimizer, first-touch rows and step
// rules.  The one C++ form of the wire's TableSpec message (proto/ps.proto) and of the Python
// spec dict (cpu_dist/common/tables.py).  Named ShardTableSpec, not TableSpec, because protoc
// already defines cpu_dist::ps::TableSpec (the message); tables.h converts between the two.
#pragma once

#include <cstdint>
#include <string>

#include "hashing.h"
#include "optimizer.h"
#include "table_rules.h"

namespace cpu_dist::ps {

struct ShardTableSpec {
  std::string name{kDefaultTable};
  uint32_t dim = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  float init_scale = 0.0f;  // first-touch rows uniform in [-s, s) (hashing.h row_init, salted)
  uint64_t seed = 0;
  uint64_t num_embeddings = 0;  // recorded for the job (0: raw ids); the shard never uses it
  uint32_t admit_after = 0;
  uint32_t expire_after = 0;
  float eps = 0.0f;  // Adagrad only (0 elsewhere)
  // A table declared by the shard's own flags (--dim, --table, ...), the one table of a job
  // without a job file: its optimizer is whichever each request names (sgd or rowwise_adagrad,
  // as before tables existed; `optimizer` above is then only a default), its state one float a
  // row.  Not on the wire: Health reports such a table with optimizer SGD.
  bool flag_declared = false;

  // The salt of both hash contracts for this table (hashing.h): 0 for "embedding".
  uint64_t salt() const { return table_salt(name); }
  // Floats of optimizer state per row (optimizer.h): dim for Adagrad, else 1.  What every
  // reader and writer of a row's state (pulls, Dump, checkpoints, the SSD tier) sizes it by.
  uint32_t state_floats() const { return ps::state_floats(optimizer, dim); }
  RuleOptions rules() const { return RuleOptions{admit_after, expire_after}; }
};

}  // namespace cpu_dist::ps
