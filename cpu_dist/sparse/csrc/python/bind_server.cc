// cpu_dist.sparse._ps.Server: one shard, served from this process.
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "server.h"
#include "spec_dict.h"
#include "tables.h"

namespace cpu_dist::python {

namespace {

using ps::PsServer;
using ServerHolder = std::unique_ptr<PsServer, GilFreeDelete<PsServer>>;

// The keywords that are not ServerOptions' first ones: limits and lifetimes.
struct ServerLimits {
  double session_idle_timeout_s;
  uint32_t max_sessions;
  uint64_t max_held_bytes;
  uint64_t max_pending_bytes;
  uint64_t max_memory_bytes;
  uint32_t max_concurrent_streams;
};

// The keywords of the table's tiers and step rules.
struct TableKeywords {
  uint64_t memory_rows;
  uint64_t memory_bytes;
  std::string ssd_dir;
  uint32_t admit_after;
  uint32_t expire_after;
};

// tables[index] (a spec dict, read by spec_dict.h) as the shard's spec; ValueError for a
// spec the shard refuses (spec_error: names, widths, scales).
ps::ShardTableSpec shard_spec(const py::handle& obj, size_t index) {
  const ps::ShardTableSpec s = ps::spec_from_proto(spec_from_dict(obj, "", "tables", index));
  if (const std::string why = ps::spec_error(s); !why.empty()) throw py::value_error(why);
  return s;
}

// The server's test hooks at the point a test names (ValueError: unknown point; RuntimeError:
// the server was not made with test_hooks=True).
std::pair<ps::TestHooks*, ps::TestPoint> hook_at(PsServer& s, const std::string& point) {
  const std::optional<ps::TestPoint> p = ps::test_point_of(point);
  if (!p)
    throw py::value_error("unknown test point '" + point + "' (" + ps::test_point_list() + ")");
  ps::TestHooks* hooks = s.test_hooks();
  if (hooks == nullptr) throw std::runtime_error("this server was not made with test_hooks=True");
  return {hooks, *p};
}

ServerHolder make_server(uint32_t dim, std::string token, std::optional<float> init_scale,
                         std::string host, int port, std::string table, uint64_t seed,
                         uint32_t shard_index, uint32_t num_shards, int64_t max_message_bytes,
                         uint32_t max_blocks_per_stripe, std::string checkpoint_dir,
                         const ServerLimits& lim, TableKeywords tk,
                         std::vector<ps::ShardTableSpec> tables, bool test_hooks) {
  if (dim > 0 && !init_scale)
    throw py::value_error("init_scale is required with dim (the flag-declared table's)");
  const int message_bytes = to_message_bytes(max_message_bytes);
  if (port < 0 || port > 65535)
    throw py::value_error("port must be in 0..65535, got " + std::to_string(port));
  if (max_blocks_per_stripe == 0 || max_blocks_per_stripe > 65536)
    throw py::value_error("max_blocks_per_stripe must be in 1..65536, got " +
                          std::to_string(max_blocks_per_stripe));
  ps::ServerOptions o;
  o.dim = dim;
  o.token = std::move(token);
  o.init_scale = init_scale.value_or(0.0f);
  o.tables = std::move(tables);
  o.host = std::move(host);
  o.port = port;
  o.table = std::move(table);
  o.seed = seed;
  o.shard_index = shard_index;
  o.num_shards = num_shards;
  o.max_message_bytes = message_bytes;
  o.max_blocks_per_stripe = max_blocks_per_stripe;
  o.checkpoint_dir = std::move(checkpoint_dir);
  o.session_idle_timeout_s = lim.session_idle_timeout_s;
  o.max_sessions = lim.max_sessions;
  o.max_held_bytes = lim.max_held_bytes;
  o.max_pending_bytes = lim.max_pending_bytes;
  o.max_memory_bytes = lim.max_memory_bytes;
  o.max_concurrent_streams = lim.max_concurrent_streams;
  o.memory_rows = tk.memory_rows;
  o.memory_bytes = tk.memory_bytes;
  o.ssd_dir = std::move(tk.ssd_dir);
  o.admit_after = tk.admit_after;
  o.expire_after = tk.expire_after;
  o.test_hooks = test_hooks;
  py::gil_scoped_release release;  // opening an SSD tier touches the disk
  return ServerHolder(std::make_unique<PsServer>(std::move(o)).release());
}

ServerHolder make_server_py(uint32_t dim, std::string token, std::optional<float> init_scale,
                            std::string host, int port, std::string table, uint64_t seed,
                            uint32_t shard_index, uint32_t num_shards, int64_t max_message_bytes,
                            uint32_t max_blocks_per_stripe, std::string checkpoint_dir,
                            double session_idle_timeout_s, uint32_t max_sessions,
                            uint64_t max_held_bytes, uint64_t max_pending_bytes,
                            uint64_t max_memory_bytes, uint32_t max_concurrent_streams,
                            uint64_t memory_rows, uint64_t memory_bytes, std::string ssd_dir,
                            uint32_t admit_after, uint32_t expire_after,
                            const std::optional<py::list>& tables, bool test_hooks) {
  std::vector<ps::ShardTableSpec> specs;
  if (tables) {
    if (tables->empty()) throw py::value_error("tables is empty (give None for the flag table)");
    for (size_t i = 0; i < tables->size(); ++i) specs.push_back(shard_spec((*tables)[i], i));
  }
  return make_server(
      dim, std::move(token), init_scale, std::move(host), port, std::move(table), seed, shard_index,
      num_shards, max_message_bytes, max_blocks_per_stripe, std::move(checkpoint_dir),
      ServerLimits{session_idle_timeout_s, max_sessions, max_held_bytes, max_pending_bytes,
                   max_memory_bytes, max_concurrent_streams},
      TableKeywords{memory_rows, memory_bytes, std::move(ssd_dir), admit_after, expire_after},
      std::move(specs), test_hooks);
}

}  // namespace

void bind_server(py::module_& m) {
  const ps::ServerOptions d;  // the one definition of the keyword defaults
  py::class_<PsServer, ServerHolder>(m, "Server",
                                     "One parameter-server shard (gRPC), served from this process.")
      .def(py::init(&make_server_py), py::arg("dim"), py::arg("token"), py::kw_only(),
           py::arg("init_scale") = py::none(), py::arg("host") = d.host, py::arg("port") = d.port,
           py::arg("table") = d.table, py::arg("seed") = d.seed,
           py::arg("shard_index") = d.shard_index, py::arg("num_shards") = d.num_shards,
           py::arg("max_message_bytes") = int64_t{d.max_message_bytes},
           py::arg("max_blocks_per_stripe") = d.max_blocks_per_stripe,
           py::arg("checkpoint_dir") = d.checkpoint_dir,
           py::arg("session_idle_timeout_s") = d.session_idle_timeout_s,
           py::arg("max_sessions") = d.max_sessions, py::arg("max_held_bytes") = d.max_held_bytes,
           py::arg("max_pending_bytes") = d.max_pending_bytes,
           py::arg("max_memory_bytes") = d.max_memory_bytes,
           py::arg("max_concurrent_streams") = d.max_concurrent_streams,
           py::arg("memory_rows") = d.memory_rows, py::arg("memory_bytes") = d.memory_bytes,
           py::arg("ssd_dir") = d.ssd_dir, py::arg("admit_after") = d.admit_after,
           py::arg("expire_after") = d.expire_after, py::arg("tables") = py::none(),
           py::arg("test_hooks") = d.test_hooks)
      .def("start", &PsServer::start, py::call_guard<py::gil_scoped_release>(),
           "Bind and serve; returns the bound port.")
      // Test-only (csrc/test_hooks.h): pause points of a server made with test_hooks=True.
      .def(
          "test_hold",
          [](PsServer& s, const std::string& point) {
            auto [hooks, p] = hook_at(s, point);
            hooks->arm(p);
          },
          py::arg("point"), "Test-only: the next thread reaching `point` holds there.")
      .def(
          "test_wait_held",
          [](PsServer& s, const std::string& point, double timeout_s) {
            auto [hooks, p] = hook_at(s, point);
            py::gil_scoped_release release;
            return hooks->wait_held(p, timeout_s);
          },
          py::arg("point"), py::arg("timeout_s") = 10.0,
          "Test-only: True once a thread holds at `point`.")
      .def(
          "test_release",
          [](PsServer& s, const std::string& point) {
            auto [hooks, p] = hook_at(s, point);
            hooks->release(p);
          },
          py::arg("point"), "Test-only: the thread held at `point` goes on.")
      .def(
          "test_fail_ssd_writes",
          [](PsServer& s, bool on) {
            ps::TestHooks* hooks = s.test_hooks();
            if (hooks == nullptr)
              throw std::runtime_error("this server was not made with test_hooks=True");
            hooks->fail_ssd_writes(on);
          },
          py::arg("on"), "Test-only: while on, every write to the SSD tier fails.")
      .def_property_readonly("port", &PsServer::port)
      .def_property_readonly("address", &PsServer::address)
      .def_property_readonly("dim", [](const PsServer& s) { return s.options().dim; })
      .def_property_readonly("table", [](const PsServer& s) { return s.options().table; })
      .def(
          "wait",
          [](PsServer& s, std::optional<double> timeout_s) {
            const double t = to_timeout(timeout_s);
            py::gil_scoped_release release;
            return s.wait(t);
          },
          py::arg("timeout_s") = py::none(), "True once the server stopped.")
      .def(
          "stop",
          [](PsServer& s, double drain_timeout_s) {
            const double t = to_timeout(drain_timeout_s, "drain_timeout_s");
            py::gil_scoped_release release;
            s.stop(t);
          },
          py::arg("drain_timeout_s") = 10.0, "Drain in-flight calls and stop.")
      .def("stats", [](const PsServer& s) {
        ps::StatsResponse r;
        {
          py::gil_scoped_release release;  // takes every stripe lock
          r = s.stats();
        }
        return message_to_dict(r);
      });
}

}  // namespace cpu_dist::python
