// cpu_dist.sparse._ps_client.Client's multi-table calls (issue 24): pull_tables(_async),
// push_tables(_async), commit_tables(_async) and create_tables.  Each takes {table: ...} for
// the tables it moves, checks every table's arguments with the GIL held (errors name the call
// and the table), then builds and sends its RPCs without it.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client_args.h"
#include "spec_dict.h"

namespace cpu_dist::python {

namespace {

using ps::AsyncOp;
using ps::OptimizerKind;
using ps::PsClient;

// A multi-table pull's keys, held while the call is planned (the pointers in `parts`).
struct TablesKeys {
  std::vector<KeysArray> arrays;
  std::vector<ps::TableKeysIn> parts;
};

TablesKeys as_tables_keys(const PsClient& c, const py::dict& parts, const char* call) {
  TablesKeys out;
  for (const auto& [name, keys] : parts) {
    const std::string n = py::cast<std::string>(name);
    const uint32_t t = table_index(c, n, call);
    KeysArray k;
    try {
      k = as_keys(keys);
    } catch (const py::value_error& e) {
      throw py::value_error(std::string(call) + ": table '" + n + "': " + e.what());
    }
    out.parts.push_back(ps::TableKeysIn{t, k.data(), static_cast<size_t>(k.shape(0))});
    out.arrays.push_back(std::move(k));
  }
  return out;
}

// A multi-table push's or commit's gradients, validated with the GIL held: the pointers in
// `parts` stay valid while the arrays live.
struct TablesUpdate {
  std::vector<KeysArray> keys;
  std::vector<RowsArray> grads;
  std::vector<ps::TableGradients> parts;
  std::optional<OptimizerKind> optimizer;
};

TablesUpdate as_tables_update(const PsClient& c, const py::dict& parts, const std::string& where,
                              const std::optional<std::string>& optimizer) {
  TablesUpdate u;
  if (optimizer) u.optimizer = parse_optimizer(*optimizer);
  for (const auto& [name, value] : parts) {
    const std::string n = py::cast<std::string>(name);
    const uint32_t t = table_index(c, n, where.c_str());
    const std::string table_where = where + " table '" + n + "'";
    const py::tuple kgl = py::cast<py::tuple>(value);
    if (kgl.size() != 3)
      throw py::value_error(table_where + ": expected (keys, grads, lr), got a tuple of " +
                            std::to_string(kgl.size()));
    KeysArray k;
    RowsArray g;
    float lr;
    try {
      k = as_keys(kgl[0]);
      g = as_grads(kgl[1], k.shape(0), c.tables()[t].dim);
      lr = check_lr(py::cast<double>(kgl[2]));
    } catch (const py::value_error& e) {
      throw py::value_error(table_where + ": " + e.what());
    }
    check_finite(k, g, table_where);
    u.parts.push_back(
        ps::TableGradients{t, k.data(), g.data(), static_cast<size_t>(k.shape(0)), lr});
    u.keys.push_back(std::move(k));
    u.grads.push_back(std::move(g));
  }
  return u;
}

std::shared_ptr<AsyncOp> start_push_tables(PsClient& c, const py::dict& parts,
                                           const std::optional<std::string>& optimizer) {
  TablesUpdate u = as_tables_update(c, parts, "push_tables", optimizer);
  py::gil_scoped_release release;
  return c.push_tables_async(u.parts, u.optimizer);
}

std::shared_ptr<AsyncOp> start_commit_tables(PsClient& c, uint64_t session, int64_t step,
                                             uint32_t rank, uint32_t world_size,
                                             const py::dict& parts, uint32_t max_ahead,
                                             int64_t base_step,
                                             const std::optional<std::string>& optimizer) {
  const ps::CommitPoint at = commit_point(session, step, rank, world_size, max_ahead, base_step);
  const std::string where = ps::commit_where(at);
  TablesUpdate u = as_tables_update(c, parts, where, optimizer);
  py::gil_scoped_release release;
  return c.commit_tables_async(at, u.parts, u.optimizer);
}

TablesHandle start_pull_tables(PsClient& c, const py::dict& parts,
                               const std::optional<std::string>& compression,
                               std::optional<uint64_t> session, bool row_steps, bool row_states,
                               std::optional<int64_t> after_step,
                               std::optional<double> wait_timeout) {
  TablesKeys k = as_tables_keys(c, parts, "pull_tables");
  const ps::PullOptions po = pull_options(compression, session, row_steps, row_states,
                                          "pull_tables", after_step, wait_timeout);
  const std::vector<ps::TableKeysIn> ordered = c.in_table_order(k.parts);
  std::vector<TablesHandle::Table> tables;
  for (const ps::TableKeysIn& p : ordered) {
    const ps::ClientTable& t = c.tables()[p.table];
    tables.push_back({t.name, static_cast<py::ssize_t>(p.n), static_cast<py::ssize_t>(t.dim)});
  }
  std::shared_ptr<AsyncOp> op;
  {
    py::gil_scoped_release release;
    op = c.pull_tables_async(ordered, po);
  }
  return TablesHandle(std::move(op), std::move(tables));
}

}  // namespace

void def_tables_ops(ClientClass& cls) {
  cls.def(
         "create_tables",
         [](PsClient& c, const py::list& specs) {
           // The shard checks the values' ranges (CreateTables' refusal names the table and
           // the field).
           std::vector<ps::TableSpec> protos;
           for (size_t i = 0; i < specs.size(); ++i)
             protos.push_back(spec_from_dict(specs[i], "create_tables: ", "specs", i));
           return shard_replies([&] { return c.create_tables(protos); });
         },
         py::arg("specs"),
         "Create the tables of `specs` (spec dicts) on every shard: idempotent for an "
         "identical spec, refused (PSError naming the table and the field) for another.  One "
         "dict per shard: {'created': n, 'existing': m}.")
      .def("pull_tables_async", &start_pull_tables, py::arg("parts"), py::kw_only(),
           py::arg("compression") = py::none(), py::arg("session") = py::none(),
           py::arg("row_steps") = false, py::arg("row_states") = false,
           py::arg("after_step") = py::none(), py::arg("wait_timeout") = py::none(),
           "Rows of several tables at once ({table: keys}): one RPC per shard per "
           "max_keys_per_rpc keys whatever the number of tables.  Returns a TablesHandle.  "
           "after_step and wait_timeout: as pull_async's.")
      .def(
          "pull_tables",
          [](PsClient& c, const py::dict& parts, const std::optional<std::string>& compression,
             std::optional<uint64_t> session) {
            return start_pull_tables(c, parts, compression, session, false, false, std::nullopt,
                                     std::nullopt)
                .wait(std::nullopt);
          },
          py::arg("parts"), py::kw_only(), py::arg("compression") = py::none(),
          py::arg("session") = py::none(),
          "Like pull_tables_async, then wait: {table: float32 rows [n, dim of that table]}.");
  const char* push_doc =
      "A direct update of several tables ({table: (keys, grads, lr)}; benchmarks, tests): "
      "per table duplicate keys are summed, then its optimizer runs once per row.";
  def_async_pair(cls, "push_tables", &start_push_tables, push_doc, py::arg("parts"), py::kw_only(),
                 py::arg("optimizer") = py::none());
  const char* commit_doc =
      "This rank's gradients of one step of a commit session for several tables ({table: "
      "(keys, grads, lr)}, tables without keys too): one RPC per shard per max_keys_per_rpc "
      "keys, every shard hearing of every step; the shards apply the step's tables all at "
      "once, once every rank's chunks arrived.";
  def_async_pair(cls, "commit_tables", &start_commit_tables, commit_doc, py::arg("session"),
                 py::arg("step"), py::arg("rank"), py::arg("world_size"), py::arg("parts"),
                 py::kw_only(), py::arg("max_ahead") = 1, py::arg("base_step") = 0,
                 py::arg("optimizer") = py::none());
}

}  // namespace cpu_dist::python
