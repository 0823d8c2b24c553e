// cpu_dist.sparse._ps.Client / Handle / PSError.  Every network call releases the GIL.
#include <cstring>
#include <optional>

#include "bindings.h"
#include "client.h"
#include "convert.h"

namespace cpu_dist::python {

namespace {

constexpr double kCheckpointTimeoutS = 600.0;  // large tables take a while to write
using ps::AsyncOp;
using ps::OptimizerKind;
using ps::PsClient;

OptimizerKind parse_optimizer(const std::string& name) {
  auto k = ps::optimizer_from_name(name);
  if (!k) throw py::value_error("optimizer must be 'sgd' or 'rowwise_adagrad', got '" + name + "'");
  return *k;
}

float check_lr(double lr) {
  if (!std::isfinite(lr)) throw py::value_error("lr must be finite, got " + std::to_string(lr));
  return static_cast<float>(lr);
}

// The state behind an asynchronous push/commit.
struct Handle {
  std::shared_ptr<AsyncOp> op;

  void wait(std::optional<double> timeout_s) {
    const double t = to_timeout(timeout_s);
    bool done;
    {
      py::gil_scoped_release release;
      done = op->wait(t);
    }
    if (!done) throw ps::WaitTimeout("operation not finished within " + std::to_string(t) + " s");
    PsClient::raise_if_failed(*op);
  }
};

// A validated push/commit payload.  Built while the GIL is held; the raw pointers stay valid
// while the arrays live, so the network call that follows can run without the GIL.
struct Update {
  KeysArray keys;
  RowsArray grads;
  OptimizerKind opt;
  float lr;
  const int64_t* k;
  const float* g;
  size_t n;
};

Update as_update(const PsClient& c, const py::handle& keys, const py::handle& grads, double lr,
                 const std::string& optimizer) {
  KeysArray k = as_keys(keys);
  RowsArray g = as_grads(grads, k.shape(0), c.dim());
  const OptimizerKind opt = parse_optimizer(optimizer);
  const float flr = check_lr(lr);
  const int64_t* kp = k.data();
  const float* gp = g.data();
  const size_t n = static_cast<size_t>(k.shape(0));
  return {std::move(k), std::move(g), opt, flr, kp, gp, n};
}

void check_rank(uint32_t rank, uint32_t world_size) {
  if (world_size == 0 || rank >= world_size)
    throw py::value_error("rank must be in 0..world_size-1, got rank " + std::to_string(rank) +
                          " world_size " + std::to_string(world_size));
}

}  // namespace

void bind_client(py::module_& m) {
  // PSError (a RuntimeError) carries "shard I (ADDR): CODE: message".
  py::register_exception<ps::RpcError>(m, "PSError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ps::WaitTimeout& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    }
  });

  py::class_<Handle>(m, "Handle", "An asynchronous push or commit in flight.")
      .def("wait", &Handle::wait, py::arg("timeout_s") = py::none(),
           "Wait until done; raises PSError on failure, TimeoutError on timeout.")
      .def("done", [](Handle& h) { return h.op->done(); });

  using ClientHolder = std::unique_ptr<PsClient, GilFreeDelete<PsClient>>;
  py::class_<PsClient, ClientHolder>(m, "Client", "Client of a set of parameter-server shards.")
      .def(py::init([](std::vector<std::string> addresses, std::string token, uint32_t dim,
                       std::string table, uint32_t max_keys_per_rpc, uint32_t channels_per_shard,
                       double timeout_s, int64_t max_message_bytes) {
             if (max_message_bytes <= 0 || max_message_bytes > INT32_MAX)
               throw py::value_error("max_message_bytes must be in 1..2^31-1, got " +
                                     std::to_string(max_message_bytes));
             ps::ClientOptions o;
             o.addresses = std::move(addresses);
             o.token = std::move(token);
             o.dim = dim;
             o.table = std::move(table);
             o.max_keys_per_rpc = max_keys_per_rpc;
             o.channels_per_shard = channels_per_shard;
             o.timeout_s = to_timeout(timeout_s);
             o.max_message_bytes = static_cast<int>(max_message_bytes);
             return ClientHolder(new PsClient(std::move(o)));
           }),
           py::arg("addresses"), py::arg("token"), py::arg("dim"), py::kw_only(),
           py::arg("table") = "embedding", py::arg("max_keys_per_rpc") = 8192,
           py::arg("channels_per_shard") = 2, py::arg("timeout_s") = 60.0,
           py::arg("max_message_bytes") = int64_t{64} << 20)
      .def("close", &PsClient::close, py::call_guard<py::gil_scoped_release>(),
           "Wait for in-flight async operations and release the client's thread; later calls "
           "raise RuntimeError.  Idempotent.")
      .def_property_readonly("num_shards", &PsClient::num_shards)
      .def_property_readonly("addresses", &PsClient::addresses)
      .def_property_readonly("dim", &PsClient::dim)
      .def(
          "pull",
          [](PsClient& c, const py::handle& keys, std::optional<py::array> out) {
            KeysArray k = as_keys(keys);
            const py::ssize_t n = k.shape(0);
            const py::ssize_t dim = c.dim();
            py::array_t<float> result;
            if (out) {
              py::array o = *out;
              const bool ok = py::isinstance<py::array_t<float>>(o) && o.ndim() == 2 &&
                              o.shape(0) == n && o.shape(1) == dim &&
                              (o.flags() & py::array::c_style) && o.writeable() &&
                              o.dtype().is(py::dtype::of<float>());
              if (!ok)
                throw py::value_error("out must be a writeable C-contiguous float32 array of "
                                      "shape (" + std::to_string(n) + ", " +
                                      std::to_string(dim) + "), got dtype " +
                                      std::string(py::str(o.dtype())) + " shape " + shape_str(o));
              result = py::reinterpret_borrow<py::array_t<float>>(o);
            } else {
              result = py::array_t<float>({n, dim});
            }
            float* dst = result.mutable_data();
            const int64_t* src = k.data();
            {
              py::gil_scoped_release release;
              c.pull(src, static_cast<size_t>(n), dst);
            }
            return result;
          },
          py::arg("keys"), py::arg("out") = py::none(),
          "Rows of `keys` as float32 [n, dim] (absent rows: their first-touch values).")
      .def(
          "push",
          [](PsClient& c, const py::handle& keys, const py::handle& grads, double lr,
             const std::string& optimizer) {
            Update u = as_update(c, keys, grads, lr, optimizer);
            py::gil_scoped_release release;
            c.push(u.k, u.g, u.n, u.lr, u.opt);
          },
          py::arg("keys"), py::arg("grads"), py::arg("lr"), py::arg("optimizer") = "sgd")
      .def(
          "push_async",
          [](PsClient& c, const py::handle& keys, const py::handle& grads, double lr,
             const std::string& optimizer) {
            Update u = as_update(c, keys, grads, lr, optimizer);
            py::gil_scoped_release release;
            return Handle{c.push_async(u.k, u.g, u.n, u.lr, u.opt)};
          },
          py::arg("keys"), py::arg("grads"), py::arg("lr"), py::arg("optimizer") = "sgd")
      .def(
          "commit",
          [](PsClient& c, uint64_t session, int64_t step, uint32_t rank, uint32_t world_size,
             const py::handle& keys, const py::handle& grads, double lr,
             const std::string& optimizer) {
            check_rank(rank, world_size);
            Update u = as_update(c, keys, grads, lr, optimizer);
            py::gil_scoped_release release;
            c.commit(session, step, rank, world_size, u.k, u.g, u.n, u.lr, u.opt);
          },
          py::arg("session"), py::arg("step"), py::arg("rank"), py::arg("world_size"),
          py::arg("keys"), py::arg("grads"), py::arg("lr"), py::arg("optimizer") = "sgd")
      .def(
          "commit_async",
          [](PsClient& c, uint64_t session, int64_t step, uint32_t rank, uint32_t world_size,
             const py::handle& keys, const py::handle& grads, double lr,
             const std::string& optimizer) {
            check_rank(rank, world_size);
            Update u = as_update(c, keys, grads, lr, optimizer);
            py::gil_scoped_release release;
            return Handle{c.commit_async(session, step, rank, world_size, u.k, u.g, u.n, u.lr, u.opt)};
          },
          py::arg("session"), py::arg("step"), py::arg("rank"), py::arg("world_size"),
          py::arg("keys"), py::arg("grads"), py::arg("lr"), py::arg("optimizer") = "sgd")
      .def(
          "wait_committed",
          [](PsClient& c, uint64_t session, int64_t step, std::optional<double> timeout_s) {
            const double t = to_timeout(timeout_s);
            py::gil_scoped_release release;
            return c.wait_committed(session, step, t < 0 ? kMaxTimeoutS : t);
          },
          py::arg("session"), py::arg("step"), py::arg("timeout_s"))
      .def("committed_step", &PsClient::committed_step, py::arg("session"),
           py::call_guard<py::gil_scoped_release>())
      .def("close_session", &PsClient::close_session, py::arg("session"), py::arg("rank"),
           py::call_guard<py::gil_scoped_release>())
      .def("stats",
           [](PsClient& c) {
             std::vector<ps::StatsResponse> r;
             {
               py::gil_scoped_release release;
               r = c.stats();
             }
             return messages_to_list(r);
           })
      .def("health",
           [](PsClient& c) {
             std::vector<ps::HealthResponse> r;
             {
               py::gil_scoped_release release;
               r = c.health();
             }
             return messages_to_list(r);
           })
      .def("shutdown", &PsClient::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Ask every shard to drain and stop.")
      .def(
          "save",
          [](PsClient& c, const std::vector<std::string>& paths, int64_t step,
             std::optional<uint64_t> session, int64_t session_step,
             std::optional<double> timeout_s) {
            std::vector<ps::SaveResponse> r;
            {
              py::gil_scoped_release release;
              r = c.save(paths, step, session.has_value(), session.value_or(0), session_step,
                         timeout_s.value_or(kCheckpointTimeoutS));
            }
            return messages_to_list(r);
          },
          py::arg("paths"), py::arg("step"), py::arg("session") = py::none(),
          py::arg("session_step") = -1, py::arg("timeout_s") = py::none(),
          "Shard i writes paths[i] (relative to its checkpoint directory); with `session`, "
          "only if that session committed exactly `session_step`.  One dict per shard.")
      .def(
          "load",
          [](PsClient& c, const std::vector<std::string>& paths, const std::vector<uint64_t>& sizes,
             const std::vector<uint32_t>& checksums, std::optional<double> timeout_s) {
            std::vector<ps::LoadResponse> r;
            {
              py::gil_scoped_release release;
              r = c.load(paths, sizes, checksums, timeout_s.value_or(kCheckpointTimeoutS));
            }
            return messages_to_list(r);
          },
          py::arg("paths"), py::arg("sizes") = std::vector<uint64_t>{},
          py::arg("checksums") = std::vector<uint32_t>{}, py::arg("timeout_s") = py::none(),
          "Every shard replaces its table by the rows it owns in `paths` (all shard files of "
          "one checkpoint), after checking them all.  One dict per shard.")
      .def("dump", [](PsClient& c) {
        ps::TableDump d;
        {
          py::gil_scoped_release release;
          d = c.dump();
        }
        const py::ssize_t n = static_cast<py::ssize_t>(d.keys.size());
        py::array_t<int64_t> keys(n);
        py::array_t<float> values({n, static_cast<py::ssize_t>(c.dim())});
        py::array_t<float> state(n);
        if (n > 0) {
          std::memcpy(keys.mutable_data(), d.keys.data(), d.keys.size() * sizeof(int64_t));
          std::memcpy(values.mutable_data(), d.values.data(), d.values.size() * sizeof(float));
          std::memcpy(state.mutable_data(), d.state.data(), d.state.size() * sizeof(float));
        }
        return py::make_tuple(keys, values, state);
      });
}

}  // namespace cpu_dist::python
