// cpu_dist.sparse._ps_client.Client / Handle / PSError / client_defaults.  Every network call
// releases the GIL.  Shaped like ps-lite: an asynchronous call returns a Handle to wait on,
// and each blocking update is its asynchronous twin followed by Handle.wait().
// The multi-table calls are bind_client_tables.cc's; what both share is client_args.h.
#include <pybind11/eval.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "client.h"
#include "client_args.h"
#include "convert.h"
#include "handle.h"

namespace cpu_dist::python {

namespace {

using ps::AsyncOp;
using ps::PsClient;

// A validated push/commit payload.  Built while the GIL is held; the pointers in `g` stay
// valid while the arrays live, so the call that follows can run without the GIL.
struct Update {
  KeysArray keys;
  RowsArray grads;
  ps::Gradients g;
};

Update as_update(const PsClient& c, const py::handle& keys, const py::handle& grads, double lr,
                 const std::string& optimizer, const std::string& where) {
  KeysArray k = as_keys(keys);
  RowsArray g = as_grads(grads, k.shape(0), c.dim());
  check_finite(k, g, where);
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
  Update u = as_update(c, keys, grads, lr, optimizer, "push");
  py::gil_scoped_release release;
  return c.push_async(u.g);
}

std::shared_ptr<AsyncOp> start_commit(PsClient& c, uint64_t session, int64_t step, uint32_t rank,
                                      uint32_t world_size, const py::handle& keys,
                                      const py::handle& grads, double lr,
                                      const std::string& optimizer, uint32_t max_ahead,
                                      int64_t base_step) {
  const ps::CommitPoint at = commit_point(session, step, rank, world_size, max_ahead, base_step);
  const std::string where = ps::commit_where(at);
  Update u = as_update(c, keys, grads, lr, optimizer, where);
  py::gil_scoped_release release;
  return c.commit_async(at, u.g);
}

py::dict traffic_dict(const ps::TrafficCounts& t) {
  py::dict d;
  d["bytes_pulled"] = t.bytes_pulled;
  d["bytes_pushed"] = t.bytes_pushed;
  d["keys_pulled"] = t.keys_pulled;
  d["keys_pushed"] = t.keys_pushed;
  d["retries"] = t.retries;
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
  out["compression"] = ps::encoding_name(d.compression);
  return out;
}

ClientHolder make_client(std::vector<std::string> addresses, std::string token, uint32_t dim,
                         std::string table,
                         std::optional<std::vector<std::pair<std::string, uint32_t>>> tables,
                         uint32_t max_keys_per_rpc, uint32_t channels_per_shard, double timeout_s,
                         int64_t max_message_bytes, const std::string& compression) {
  const int message_bytes = to_message_bytes(max_message_bytes);
  ps::ClientOptions o;
  o.addresses = std::move(addresses);
  o.token = std::move(token);
  o.dim = dim;
  o.table = std::move(table);
  if (tables) {
    if (tables->empty()) throw py::value_error("tables must name at least one table (or be None)");
    for (auto& [name, tdim] : *tables) o.tables.push_back(ps::ClientTable{name, tdim});
  }
  o.max_keys_per_rpc = max_keys_per_rpc;
  o.channels_per_shard = channels_per_shard;
  o.timeout_s = to_timeout(timeout_s);
  o.max_message_bytes = message_bytes;
  o.compression = parse_compression(compression);
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

// A vector handed to numpy without a copy: the array owns it.
template <class T>
py::array_t<T> owned_array(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto heap = std::make_unique<std::vector<T>>(std::move(v));
  T* data = heap->data();
  py::capsule owner(heap.get(), [](void* p) { delete static_cast<std::vector<T>*>(p); });
  heap.release();  // the capsule owns it now
  return py::array_t<T>(shape, data, owner);
}

py::tuple dump_tuple(ps::DumpRows&& d, uint32_t dim) {
  const py::ssize_t n = static_cast<py::ssize_t>(d.keys.size());
  const py::ssize_t w = d.state_width;
  std::vector<py::ssize_t> state_shape{n};
  if (w != 1) state_shape.push_back(w);  // element-wise Adagrad: [n, dim]
  return py::make_tuple(owned_array(std::move(d.keys), {n}),
                        owned_array(std::move(d.values), {n, static_cast<py::ssize_t>(dim)}),
                        owned_array(std::move(d.state), state_shape));
}

// Client.dump_pages' iterator.
class DumpPages {
 public:
  DumpPages(std::unique_ptr<ps::DumpPager> pager, uint32_t dim)
      : pager_(std::move(pager)), dim_(dim) {}
  py::tuple next() {
    ps::DumpRows page;
    bool more;
    {
      py::gil_scoped_release release;
      more = pager_->next(&page);
    }
    if (!more) throw py::stop_iteration();
    return dump_tuple(std::move(page), dim_);
  }

 private:
  std::unique_ptr<ps::DumpPager> pager_;
  uint32_t dim_;
};

void def_data_ops(ClientClass& cls) {
  cls.def(
         "pull",
         [](PsClient& c, const py::handle& keys, std::optional<py::array> out,
            const std::optional<std::string>& compression, std::optional<uint64_t> session) {
           KeysArray k = as_keys(keys);
           const ps::PullOptions po = pull_options(compression, session);
           py::array_t<float> result = pull_target(std::move(out), k.shape(0), c.dim());
           float* dst = result.mutable_data();
           {
             py::gil_scoped_release release;
             c.pull(k.data(), static_cast<size_t>(k.shape(0)), dst, po);
           }
           return result;
         },
         py::arg("keys"), py::arg("out") = py::none(), py::kw_only(),
         py::arg("compression") = py::none(), py::arg("session") = py::none(),
         "Rows of `keys` as float32 [n, dim] (absent rows: their first-touch values), sent "
         "encoded as `compression` (None: the client's).  With `session`, each shard also "
         "reports that commit session's committed step: last_pull_committed().")
      .def(
          "pull_async",
          [](PsClient& c, const py::handle& keys, const std::optional<std::string>& compression,
             std::optional<uint64_t> session, bool row_steps, bool row_states,
             std::optional<int64_t> after_step, std::optional<double> wait_timeout) {
            KeysArray k = as_keys(keys);
            const ps::PullOptions po = pull_options(compression, session, row_steps, row_states,
                                                    "pull_async", after_step, wait_timeout);
            std::shared_ptr<AsyncOp> op;
            {
              py::gil_scoped_release release;
              op = c.pull_async(k.data(), static_cast<size_t>(k.shape(0)), po);
            }
            return Handle(std::move(op), k.shape(0), c.dim());
          },
          py::arg("keys"), py::kw_only(), py::arg("compression") = py::none(),
          py::arg("session") = py::none(), py::arg("row_steps") = false,
          py::arg("row_states") = false, py::arg("after_step") = py::none(),
          py::arg("wait_timeout") = py::none(),
          "Like pull, at once: the Handle's wait() returns the rows (a new array), its "
          "committed_step() what the shards reported for `session`; with row_steps and "
          "row_states (need `session`) its row_steps() and row_states() what each row holds.  "
          "With after_step (needs `session` and wait_timeout seconds): every shard answers "
          "once that session step is committed on it, with the rows as they are then, so "
          "committed_step() >= after_step (one round trip for a wait and a pull).")
      .def("last_pull_committed", &PsClient::last_pull_committed,
           "Of the last blocking pull that named a session: the minimum committed step of the "
           "shards it touched (-1: none of them has one); None before such a pull or when it "
           "touched no shard.  Threads that pull concurrently use pull_async and "
           "Handle.committed_step() instead.");
  const char* push_doc =
      "A direct update (benchmarks, tests, bulk loading of large tables; training uses "
      "commit): duplicate keys are summed, then the optimizer runs once per row.";
  def_async_pair(cls, "push", &start_push, push_doc, py::arg("keys"), py::arg("grads"),
                 py::arg("lr"), py::arg("optimizer") = "sgd");
  const char* commit_doc =
      "This rank's gradients of one step of a commit session; the shards apply the step "
      "once every rank's arrived, steps in order.  A shard accepts the chunks of a step up "
      "to max_ahead steps beyond its committed one (1: the next step only) and holds them.  "
      "base_step: the job step of the session's step 0 (constant per session), which the "
      "shards' admission and expiry rules count on.";
  def_async_pair(cls, "commit", &start_commit, commit_doc, py::arg("session"), py::arg("step"),
                 py::arg("rank"), py::arg("world_size"), py::arg("keys"), py::arg("grads"),
                 py::arg("lr"), py::arg("optimizer") = "sgd", py::kw_only(),
                 py::arg("max_ahead") = 1, py::arg("base_step") = 0);
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
           py::call_guard<py::gil_scoped_release>())
      .def(
          "abort_sessions",
          [](PsClient& c) { return shard_replies([&] { return c.abort_sessions(); }); },
          "End every open commit session on every shard (their chunks dropped, their waiters "
          "failed): what a job that takes the shards over does before load().  One dict per "
          "shard: {'aborted': n}.");
}

void def_admin(ClientClass& cls) {
  cls.def("stats", [](PsClient& c) { return shard_replies([&] { return c.stats(); }); })
      .def("health", [](PsClient& c) { return shard_replies([&] { return c.health(); }); })
      .def(
          "traffic", [](const PsClient& c) { return traffic_dict(c.traffic()); },
          "Payload bytes and keys this client moved (successful RPCs), rows counted as encoded "
          "on the wire: bytes_pulled (keys sent + rows, row_steps and row_states received by "
          "pulls), bytes_pushed (keys "
          "+ gradients sent by pushes and commits), keys_pulled, keys_pushed, and retries "
          "(pulls and commit chunks sent again after UNAVAILABLE).")
      .def("shutdown", &PsClient::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Ask every shard to drain and stop.")
      .def(
          "dump",
          [](PsClient& c, const std::optional<std::string>& table,
             std::optional<uint64_t> max_bytes) {
            const uint32_t t = table_arg(c, table, "dump");
            ps::DumpRows d;
            {
              py::gil_scoped_release release;
              d = c.dump(max_bytes.value_or(0), t);
            }
            return dump_tuple(std::move(d), c.tables()[t].dim);
          },
          py::kw_only(), py::arg("table") = py::none(), py::arg("max_bytes") = py::none(),
          "Every row of every shard of `table` (None: the client's one-table calls' table) "
          "sorted by key, as (keys, values, state: float32 [n], or [n, dim] for Adagrad); "
          "fetched in pages of at most max_bytes (None: the default page), shards in "
          "parallel; no size limit.")
      .def(
          "dump_pages",
          [](PsClient& c, const std::optional<std::string>& table,
             std::optional<uint64_t> max_bytes) {
            const uint32_t t = table_arg(c, table, "dump_pages");
            std::unique_ptr<ps::DumpPager> pager;
            {
              py::gil_scoped_release release;
              pager = c.dump_pages(max_bytes.value_or(0), t);
            }
            return DumpPages(std::move(pager), c.tables()[t].dim);
          },
          py::kw_only(), py::arg("table") = py::none(), py::arg("max_bytes") = py::none(),
          py::keep_alive<0, 1>(),
          "An iterator of pages (keys, values, state), each sorted by key and from one shard, "
          "pages in no global order; at most one page per shard is held at a time.");
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
  // PSError (a RuntimeError): str() is "shard I (ADDR): CODE: message"; the attributes shard,
  // address and code say the same as fields (None where a failure has none).  A Python class,
  // so that PSError(message) still builds one (the job re-raises it with a new message).
  py::dict scope;
  scope["__builtins__"] = py::module_::import("builtins");
  scope["__name__"] = m.attr("__name__");
  py::exec(R"(
class PSError(RuntimeError):
    """A failed parameter-server call: str() is "shard I (ADDR): CODE: message".

    shard (int), address (str) and code (the gRPC status code's name, e.g. "UNAVAILABLE")
    name the failure without parsing the text; None where it has none."""

    def __init__(self, message, shard=None, address=None, code=None):
        super().__init__(message)
        self.shard = shard
        self.address = address
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.shard, self.address, self.code))
)",
           scope);
  py::object ps_error = scope["PSError"];
  ps_error.attr("__module__") = m.attr("__name__");
  m.attr("PSError") = ps_error;
  // A translator is a plain function (no state of its own): it finds the class on the module.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ps::WaitTimeout& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const ps::RpcError& e) {
      const auto text_or_none = [](const std::string& s) -> py::object {
        return s.empty() ? py::none() : py::object(py::str(s));
      };
      const py::object type = py::module_::import("cpu_dist.sparse._ps_client").attr("PSError");
      const py::object shard = e.shard() ? py::object(py::int_(*e.shard())) : py::none();
      const py::object exc =
          type(py::str(e.what()), shard, text_or_none(e.address()), text_or_none(e.code()));
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });
  m.def("client_defaults", &client_defaults,
        "Client's keyword defaults: max_keys_per_rpc, channels_per_shard, timeout_s, "
        "max_message_bytes, compression.");
  bind_codec(m);
  bind_reads(m);

  py::class_<DumpPages>(m, "DumpPages", "Pages of a dump (Client.dump_pages).")
      .def("__iter__", [](DumpPages& p) -> DumpPages& { return p; })
      .def("__next__", &DumpPages::next);

  bind_handle(m);

  const ps::ClientOptions defaults;  // the one definition of the keyword defaults
  ClientClass cls(m, "Client", "Client of a set of parameter-server shards.");
  cls.def(py::init(&make_client), py::arg("addresses"), py::arg("token"), py::arg("dim") = 0,
          py::kw_only(), py::arg("table") = defaults.table, py::arg("tables") = py::none(),
          py::arg("max_keys_per_rpc") = defaults.max_keys_per_rpc,
          py::arg("channels_per_shard") = defaults.channels_per_shard,
          py::arg("timeout_s") = defaults.timeout_s,
          py::arg("max_message_bytes") = int64_t{defaults.max_message_bytes},
          py::arg("compression") = ps::encoding_name(defaults.compression))
      .def("close", &PsClient::close, py::call_guard<py::gil_scoped_release>(),
           "Wait for in-flight async operations and release the client's thread; later calls "
           "raise RuntimeError.  Idempotent.")
      .def_property_readonly("num_shards", &PsClient::num_shards)
      .def_property_readonly("addresses", &PsClient::addresses)
      .def_property_readonly("dim", &PsClient::dim)
      .def_property_readonly("table", &PsClient::table)
      .def_property_readonly(
          "tables",
          [](const PsClient& c) {
            py::list out;
            for (const ps::ClientTable& t : c.tables()) out.append(py::make_tuple(t.name, t.dim));
            return out;
          },
          "(name, dim) of every table of the multi-table calls, in the order they cross the "
          "wire.")
      .def_property_readonly("compression",
                             [](const PsClient& c) { return ps::encoding_name(c.compression()); });
  def_data_ops(cls);
  def_tables_ops(cls);
  def_sessions(cls);
  def_admin(cls);
  def_checkpoints(cls);
}

}  // namespace cpu_dist::python
