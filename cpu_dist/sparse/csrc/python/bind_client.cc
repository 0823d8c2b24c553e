// cpu_dist.sparse._ps.Client / Handle / PSError / client_defaults.  Every network call
// releases the GIL.  Shaped like ps-lite: an asynchronous call returns a Handle to wait on,
// and each blocking update is its asynchronous twin followed by Handle.wait().
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "client.h"
#include "convert.h"

namespace cpu_dist::python {

namespace {

using ps::AsyncOp;
using ps::OptimizerKind;
using ps::PsClient;
using ClientHolder = std::unique_ptr<PsClient, GilFreeDelete<PsClient>>;
using ClientClass = py::class_<PsClient, ClientHolder>;

OptimizerKind parse_optimizer(const std::string& name) {
  auto k = ps::optimizer_from_name(name);
  if (!k) throw py::value_error("optimizer must be 'sgd' or 'rowwise_adagrad', got '" + name + "'");
  return *k;
}

float check_lr(double lr) {
  if (!std::isfinite(lr)) throw py::value_error("lr must be finite, got " + std::to_string(lr));
  return static_cast<float>(lr);
}

void check_rank(uint32_t rank, uint32_t world_size) {
  if (world_size == 0 || rank >= world_size)
    throw py::value_error("rank must be in 0..world_size-1, got rank " + std::to_string(rank) +
                          " world_size " + std::to_string(world_size));
}

// Rows an operation owned, handed to numpy without a copy: the array frees them.
py::array_t<float> owned_rows(ps::RowBuffer rows, py::ssize_t n, py::ssize_t dim) {
  float* data = rows.get();
  py::capsule owner(data, [](void* p) { std::free(p); });
  rows.release();  // the capsule owns them now
  return py::array_t<float>({n, dim}, data, owner);
}

// An asynchronous operation in flight.  Dropping it is safe: the client keeps the operation
// (and the rows a pull decodes into) until its last RPC finished.
class Handle {
 public:
  // rows >= 0: a pull of that many keys, whose wait() returns the rows.
  explicit Handle(std::shared_ptr<AsyncOp> op, py::ssize_t rows = -1, py::ssize_t dim = 0)
      : op_(std::move(op)), rows_(rows), dim_(dim) {}

  py::object wait(std::optional<double> timeout_s) {
    const double t = to_timeout(timeout_s);
    bool done;
    {
      py::gil_scoped_release release;
      done = op_->wait(t);
    }
    if (!done) throw ps::WaitTimeout("operation not finished within " + std::to_string(t) + " s");
    op_->raise_if_failed();
    if (rows_ < 0) return py::none();
    if (!result_) result_ = owned_rows(op_->take_output(), rows_, dim_);
    return result_;
  }
  bool done() const { return op_->done(); }

 private:
  std::shared_ptr<AsyncOp> op_;
  py::ssize_t rows_;
  py::ssize_t dim_;
  py::object result_;  // the rows, once a wait() returned them
};

// A validated push/commit payload.  Built while the GIL is held; the pointers in `g` stay
// valid while the arrays live, so the call that follows can run without the GIL.
struct Update {
  KeysArray keys;
  RowsArray grads;
  ps::Gradients g;
};

Update as_update(const PsClient& c, const py::handle& keys, const py::handle& grads, double lr,
                 const std::string& optimizer) {
  KeysArray k = as_keys(keys);
  RowsArray g = as_grads(grads, k.shape(0), c.dim());
  Update u{std::move(k), std::move(g), ps::Gradients()};  // moves keep the arrays' data
  u.g.keys = u.keys.data();
  u.g.grads = u.grads.data();
  u.g.n = static_cast<size_t>(u.keys.shape(0));
  u.g.optimizer = parse_optimizer(optimizer);
  u.g.lr = check_lr(lr);
  return u;
}

// The starts of the asynchronous updates: arguments checked with the GIL, then the RPCs
// built and sent without it.
std::shared_ptr<AsyncOp> start_push(PsClient& c, const py::handle& keys, const py::handle& grads,
                                    double lr, const std::string& optimizer) {
  Update u = as_update(c, keys, grads, lr, optimizer);
  py::gil_scoped_release release;
  return c.push_async(u.g);
}

std::shared_ptr<AsyncOp> start_commit(PsClient& c, uint64_t session, int64_t step, uint32_t rank,
                                      uint32_t world_size, const py::handle& keys,
                                      const py::handle& grads, double lr,
                                      const std::string& optimizer) {
  check_rank(rank, world_size);
  Update u = as_update(c, keys, grads, lr, optimizer);
  py::gil_scoped_release release;
  return c.commit_async(ps::CommitPoint{session, step, rank, world_size}, u.g);
}

// Defines `name` (blocking) and `name`_async (returning a Handle) from one start function:
// the blocking form is the asynchronous one followed by Handle.wait().
template <class... Args, class... Extra>
void def_async_pair(ClientClass& cls, const std::string& name,
                    std::shared_ptr<AsyncOp> (*start)(PsClient&, Args...), const char* doc,
                    const Extra&... extra) {
  cls.def(
      name.c_str(),
      [start](PsClient& c, Args... args) { Handle(start(c, args...)).wait(std::nullopt); },
      extra..., doc);
  const std::string async_doc = std::string(doc) + "  Returns a Handle at once.";
  cls.def((name + "_async").c_str(),
          [start](PsClient& c, Args... args) { return Handle(start(c, args...)); }, extra...,
          async_doc.c_str());
}

py::dict traffic_dict(const ps::TrafficCounts& t) {
  py::dict d;
  d["bytes_pulled"] = t.bytes_pulled;
  d["bytes_pushed"] = t.bytes_pushed;
  d["keys_pulled"] = t.keys_pulled;
  d["keys_pushed"] = t.keys_pushed;
  return d;
}

// The client's defaults as Python sees them, from their one definition (ClientOptions).
py::dict client_defaults() {
  const ps::ClientOptions d;
  py::dict out;
  out["max_keys_per_rpc"] = d.max_keys_per_rpc;
  out["channels_per_shard"] = d.channels_per_shard;
  out["timeout_s"] = d.timeout_s;
  out["max_message_bytes"] = d.max_message_bytes;
  return out;
}

ClientHolder make_client(std::vector<std::string> addresses, std::string token, uint32_t dim,
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
  return ClientHolder(std::make_unique<PsClient>(std::move(o)).release());
}

// pull's `out`: a writeable C-contiguous float32 [n, dim] array, or a fresh one.
py::array_t<float> pull_target(std::optional<py::array> out, py::ssize_t n, py::ssize_t dim) {
  if (!out) return py::array_t<float>({n, dim});
  py::array o = *out;
  const bool ok = py::isinstance<py::array_t<float>>(o) && o.ndim() == 2 && o.shape(0) == n &&
                  o.shape(1) == dim && (o.flags() & py::array::c_style) && o.writeable() &&
                  o.dtype().is(py::dtype::of<float>());
  if (!ok)
    throw py::value_error("out must be a writeable C-contiguous float32 array of shape (" +
                          std::to_string(n) + ", " + std::to_string(dim) + "), got dtype " +
                          std::string(py::str(o.dtype())) + " shape " + shape_str(o));
  return py::reinterpret_borrow<py::array_t<float>>(o);
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

void def_data_ops(ClientClass& cls) {
  cls.def(
         "pull",
         [](PsClient& c, const py::handle& keys, std::optional<py::array> out) {
           KeysArray k = as_keys(keys);
           py::array_t<float> result = pull_target(std::move(out), k.shape(0), c.dim());
           float* dst = result.mutable_data();
           {
             py::gil_scoped_release release;
             c.pull(k.data(), static_cast<size_t>(k.shape(0)), dst);
           }
           return result;
         },
         py::arg("keys"), py::arg("out") = py::none(),
         "Rows of `keys` as float32 [n, dim] (absent rows: their first-touch values).")
      .def(
          "pull_async",
          [](PsClient& c, const py::handle& keys) {
            KeysArray k = as_keys(keys);
            std::shared_ptr<AsyncOp> op;
            {
              py::gil_scoped_release release;
              op = c.pull_async(k.data(), static_cast<size_t>(k.shape(0)));
            }
            return Handle(std::move(op), k.shape(0), c.dim());
          },
          py::arg("keys"),
          "Like pull, at once: the Handle's wait() returns the rows (a new array).");
  const char* push_doc =
      "A direct update (benchmarks, tests, bulk loading of large tables; training uses "
      "commit): duplicate keys are summed, then the optimizer runs once per row.";
  def_async_pair(cls, "push", &start_push, push_doc, py::arg("keys"), py::arg("grads"),
                 py::arg("lr"), py::arg("optimizer") = "sgd");
  const char* commit_doc =
      "This rank's gradients of one step of a commit session; the shards apply the step "
      "once every rank's arrived.";
  def_async_pair(cls, "commit", &start_commit, commit_doc, py::arg("session"), py::arg("step"),
                 py::arg("rank"), py::arg("world_size"), py::arg("keys"), py::arg("grads"),
                 py::arg("lr"), py::arg("optimizer") = "sgd");
}

void def_sessions(ClientClass& cls) {
  cls.def(
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
           py::call_guard<py::gil_scoped_release>());
}

void def_admin(ClientClass& cls) {
  cls.def("stats", [](PsClient& c) { return shard_replies([&] { return c.stats(); }); })
      .def("health", [](PsClient& c) { return shard_replies([&] { return c.health(); }); })
      .def(
          "traffic", [](const PsClient& c) { return traffic_dict(c.traffic()); },
          "Payload bytes and keys this client moved (successful RPCs): bytes_pulled (keys "
          "sent + rows received by pulls), bytes_pushed (keys + gradients sent by pushes and "
          "commits), keys_pulled, keys_pushed.")
      .def("shutdown", &PsClient::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Ask every shard to drain and stop.")
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

// Checkpoint calls: timeout_s None is the client's timeout_s (the job passes its
// --checkpoint-timeout).
double checkpoint_timeout(const PsClient& c, std::optional<double> timeout_s) {
  return timeout_s ? to_timeout(timeout_s) : c.timeout_s();
}

void def_checkpoints(ClientClass& cls) {
  cls.def(
         "save",
         [](PsClient& c, const std::vector<std::string>& paths, int64_t step,
            std::optional<uint64_t> session, int64_t session_step,
            std::optional<double> timeout_s) {
           const double t = checkpoint_timeout(c, timeout_s);
           return shard_replies([&] {
             return c.save(paths, step, session.has_value(), session.value_or(0), session_step, t);
           });
         },
         py::arg("paths"), py::arg("step"), py::arg("session") = py::none(),
         py::arg("session_step") = -1, py::arg("timeout_s") = py::none(),
         "Shard i writes paths[i] (relative to its checkpoint directory); with `session`, "
         "only if that session committed exactly `session_step`.  One dict per shard.")
      .def(
          "load",
          [](PsClient& c, const std::vector<std::string>& paths, const std::vector<uint64_t>& sizes,
             const std::vector<uint32_t>& checksums, std::optional<double> timeout_s) {
            const double t = checkpoint_timeout(c, timeout_s);
            return shard_replies([&] { return c.load(paths, sizes, checksums, t); });
          },
          py::arg("paths"), py::arg("sizes") = std::vector<uint64_t>{},
          py::arg("checksums") = std::vector<uint32_t>{}, py::arg("timeout_s") = py::none(),
          "Every shard replaces its table by the rows it owns in `paths` (all shard files of "
          "one checkpoint), after checking them all.  One dict per shard.");
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
  m.def("client_defaults", &client_defaults,
        "Client's keyword defaults: max_keys_per_rpc, channels_per_shard, timeout_s, "
        "max_message_bytes.");

  py::class_<Handle>(m, "Handle", "An asynchronous pull, push or commit in flight.")
      .def("wait", &Handle::wait, py::arg("timeout_s") = py::none(),
           "Wait until done: None for a push or commit, the rows for a pull.  Raises PSError "
           "on failure, TimeoutError on timeout.")
      .def("done", &Handle::done);

  const ps::ClientOptions defaults;  // the one definition of the keyword defaults
  ClientClass cls(m, "Client", "Client of a set of parameter-server shards.");
  cls.def(py::init(&make_client), py::arg("addresses"), py::arg("token"), py::arg("dim"),
          py::kw_only(), py::arg("table") = defaults.table,
          py::arg("max_keys_per_rpc") = defaults.max_keys_per_rpc,
          py::arg("channels_per_shard") = defaults.channels_per_shard,
          py::arg("timeout_s") = defaults.timeout_s,
          py::arg("max_message_bytes") = int64_t{defaults.max_message_bytes})
      .def("close", &PsClient::close, py::call_guard<py::gil_scoped_release>(),
           "Wait for in-flight async operations and release the client's thread; later calls "
           "raise RuntimeError.  Idempotent.")
      .def_property_readonly("num_shards", &PsClient::num_shards)
      .def_property_readonly("addresses", &PsClient::addresses)
      .def_property_readonly("dim", &PsClient::dim);
  def_data_ops(cls);
  def_sessions(cls);
  def_admin(cls);
  def_checkpoints(cls);
}

}  // namespace cpu_dist::python
