// What the two files of the Client binding share (bind_client.cc: the one-table calls, sessions,
// administration; bind_client_tables.cc: the multi-table calls): the argument checks, with
// the same refusal text for the same bad argument in every call, and the shapes of the calls.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "bindings.h"
#include "client.h"
#include "commit_limits.h"
#include "convert.h"
#include "finite.h"
#include "handle.h"

namespace cpu_dist::python {

using ClientHolder = std::unique_ptr<ps::PsClient, GilFreeDelete<ps::PsClient>>;
using ClientClass = py::class_<ps::PsClient, ClientHolder>;

inline ps::OptimizerKind parse_optimizer(const std::string& name) {
  auto k = ps::optimizer_from_name(name);
  if (!k)
    throw py::value_error("optimizer must be 'sgd', 'rowwise_adagrad' or 'adagrad', got '" + name +
                          "'");
  return *k;
}

inline float check_lr(double lr) {
  const float f = static_cast<float>(lr);
  if (!std::isfinite(lr) || !std::isfinite(f) || !(f > 0.0f))
    throw py::value_error("lr must be finite and > 0 (as float32), got " + std::to_string(lr));
  return f;
}

inline uint32_t check_max_ahead(uint32_t max_ahead) {
  if (max_ahead == 0 || max_ahead > ps::kMaxCommitAhead)
    throw py::value_error("max_ahead must be in 1.." + std::to_string(ps::kMaxCommitAhead) +
                          ", got " + std::to_string(max_ahead));
  return max_ahead;
}

// Refuses gradients a shard would refuse, before anything is sent: NaN, infinity, and
// float64 values beyond float32's range (they became infinity in the conversion).  `where`
// names the call ("push", "commit of session S step T rank R").
inline void check_finite(const KeysArray& keys, const RowsArray& grads, const std::string& where) {
  const float* g = grads.data();
  const size_t dim = static_cast<size_t>(grads.shape(1));
  const size_t count = static_cast<size_t>(grads.size());
  const size_t i = ps::first_non_finite(g, count);
  if (i < count)
    throw py::value_error("gradient of key " + std::to_string(keys.data()[i / dim]) + " in " +
                          where + " (row " + std::to_string(i / dim) + ", column " +
                          std::to_string(i % dim) + ") is not finite as float32 (" +
                          std::to_string(g[i]) +
                          "): a NaN, an infinity, or a float64 value beyond float32's range; "
                          "nothing was sent");
}

inline void check_rank(uint32_t rank, uint32_t world_size) {
  if (world_size == 0 || rank >= world_size)
    throw py::value_error("rank must be in 0..world_size-1, got rank " + std::to_string(rank) +
                          " world_size " + std::to_string(world_size));
}

// The CommitPoint of a commit's arguments (ValueError for a rank, max_ahead or base_step out of
// range).
inline ps::CommitPoint commit_point(uint64_t session, int64_t step, uint32_t rank,
                                    uint32_t world_size, uint32_t max_ahead, int64_t base_step) {
  check_rank(rank, world_size);
  if (base_step < 0)
    throw py::value_error("base_step must be >= 0, got " + std::to_string(base_step));
  return ps::CommitPoint{session, step, rank, world_size, check_max_ahead(max_ahead), base_step};
}

// A call's `table` keyword: None is the one-table calls' table; a name not among the
// client's tables is a ValueError naming it and them.
inline uint32_t table_index(const ps::PsClient& c, const std::string& name, const char* call) {
  if (auto t = c.table_index(name)) return *t;
  std::string known;
  for (const ps::ClientTable& t : c.tables()) known += (known.empty() ? "'" : ", '") + t.name + "'";
  throw py::value_error(std::string(call) + ": table '" + name +
                        "' is not one of this client's tables (" + known + ")");
}

inline uint32_t table_arg(const ps::PsClient& c, const std::optional<std::string>& table,
                          const char* call) {
  return table_index(c, table.value_or(c.table()), call);
}

// A call whose result is a list of per-shard messages, run without the GIL.
template <class Fn>
py::list shard_replies(Fn&& call) {
  decltype(call()) r;
  {
    py::gil_scoped_release release;
    r = call();
  }
  return messages_to_list(r);
}

// A pull's keywords: compression None is the client's; row_steps and row_states (of `call`,
// an asynchronous pull) need a session.
inline ps::PullOptions pull_options(const std::optional<std::string>& compression,
                                    std::optional<uint64_t> session, bool row_steps = false,
                                    bool row_states = false, const char* call = "pull",
                                    std::optional<int64_t> after_step = std::nullopt,
                                    std::optional<double> wait_timeout = std::nullopt) {
  ps::PullOptions po;
  po.after_step = after_step;  // checked by the client (PsClient::route_pull)
  po.wait_timeout_s = wait_timeout.value_or(0.0);
  if (compression) po.compression = parse_compression(*compression);
  po.session = session;
  if ((row_steps || row_states) && !session)
    throw py::value_error(std::string(call) + ": row_steps and row_states need a session");
  po.row_steps = row_steps;
  po.row_states = row_states;
  return po;
}

// Defines `name` (blocking) and `name`_async (returning a Handle) from one start function:
// the blocking form is the asynchronous one followed by Handle.wait().
template <class... Args, class... Extra>
void def_async_pair(ClientClass& cls, const std::string& name,
                    std::shared_ptr<ps::AsyncOp> (*start)(ps::PsClient&, Args...), const char* doc,
                    const Extra&... extra) {
  cls.def(
      name.c_str(),
      [start](ps::PsClient& c, Args... args) { Handle(start(c, args...)).wait(std::nullopt); },
      extra..., doc);
  const std::string async_doc = std::string(doc) + "  Returns a Handle at once.";
  cls.def((name + "_async").c_str(),
          [start](ps::PsClient& c, Args... args) { return Handle(start(c, args...)); }, extra...,
          async_doc.c_str());
}

void def_tables_ops(ClientClass& cls);  // bind_client_tables.cc

}  // namespace cpu_dist::python
