// cpu_dist.sparse._ps_client.Handle (handle.h).
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "convert.h"
#include "handle.h"

namespace cpu_dist::python {

namespace {

// Rows an operation owned, handed to numpy without a copy: the array frees them.
py::array_t<float> owned_rows(ps::RowBuffer rows, py::ssize_t n, py::ssize_t dim) {
  float* data = rows.get();
  py::capsule owner(data, [](void* p) { std::free(p); });
  rows.release();  // the capsule owns them now
  return py::array_t<float>({n, dim}, data, owner);
}

template <class T>
py::object copy_out(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(T));
  return out;
}

}  // namespace

void OpHandle::wait_done(std::optional<double> timeout_s) {
  const double t = to_timeout(timeout_s);
  bool done;
  {
    py::gil_scoped_release release;
    done = op_->wait(t);
  }
  if (!done) throw ps::WaitTimeout("operation not finished within " + std::to_string(t) + " s");
  op_->raise_if_failed();
}

py::object Handle::wait(std::optional<double> timeout_s) {
  wait_done(timeout_s);
  if (rows_ < 0) return py::none();
  if (!result_) result_ = owned_rows(op_->take_output(), rows_, dim_);
  return result_;
}

py::object Handle::row_steps() const {
  auto report = op_->report();
  if (report == nullptr || !report->wants_steps()) return py::none();
  return copy_out(report->steps());
}

py::object Handle::row_states() const {
  auto report = op_->report();
  if (report == nullptr || !report->wants_states()) return py::none();
  py::object states = copy_out(report->states());
  if (report->state_width() != 1)  // element-wise Adagrad: [n, dim]
    states = states.attr("reshape")(rows_, report->state_width());
  return states;
}

py::dict TablesHandle::wait(std::optional<double> timeout_s) {
  wait_done(timeout_s);
  if (!result_) {
    py::dict out;
    for (size_t i = 0; i < tables_.size(); ++i)
      out[py::str(tables_[i].name)] =
          owned_rows(op_->take_output(i), tables_[i].rows, tables_[i].dim);
    result_ = out;
  }
  return py::reinterpret_borrow<py::dict>(result_);
}

py::object TablesHandle::row_steps() const {
  py::dict out;
  for (size_t i = 0; i < tables_.size(); ++i) {
    auto report = op_->report(i);
    if (report == nullptr || !report->wants_steps()) return py::none();
    out[py::str(tables_[i].name)] = copy_out(report->steps());
  }
  return std::move(out);
}

py::object TablesHandle::row_states() const {
  py::dict out;
  for (size_t i = 0; i < tables_.size(); ++i) {
    auto report = op_->report(i);
    if (report == nullptr || !report->wants_states()) return py::none();
    py::object states = copy_out(report->states());
    if (report->state_width() != 1)  // element-wise Adagrad: [n, dim]
      states = states.attr("reshape")(tables_[i].rows, report->state_width());
    out[py::str(tables_[i].name)] = states;
  }
  return std::move(out);
}

namespace {

// The docstrings of Handle and TablesHandle: one text, each class filling in only what it
// returns (a pull's rows, or {table: rows}).
struct HandleDocs {
  std::string wait, committed_step, row_steps, row_states;
};

HandleDocs handle_docs(const std::string& rows, const std::string& steps,
                       const std::string& states) {
  return HandleDocs{
      "Wait until done: " + rows + ".  Raises PSError on failure, TimeoutError on timeout.",
      "Of a finished pull that named a session: the minimum committed step of the shards it "
      "touched (-1: none of them has one); None otherwise.",
      "Of a finished pull that asked for row_steps: " + steps +
          ", the session step up to which the row holds every commit of the session that "
          "touched it (and none after); int64 min where the shard gave no bound.  None otherwise.",
      "Of a finished pull that asked for row_states: " + states +
          ", the rows' optimizer states.  None otherwise."};
}

template <class H>
void def_handle(py::module_& m, const char* name, const char* doc, const HandleDocs& d) {
  py::class_<H>(m, name, doc)
      .def("wait", &H::wait, py::arg("timeout_s") = py::none(), d.wait.c_str())
      .def("done", &OpHandle::done)
      .def("committed_step", &OpHandle::committed_step, d.committed_step.c_str())
      .def("row_steps", &H::row_steps, d.row_steps.c_str())
      .def("row_states", &H::row_states, d.row_states.c_str());
}

}  // namespace

void bind_handle(py::module_& m) {
  // Per row of a pull of one table; a multi-table pull's are {table: the same}.
  const std::string steps = "int64 per row";
  const std::string states = "float32 [n] (sgd, row-wise Adagrad) or [n, dim] (Adagrad)";
  def_handle<Handle>(m, "Handle", "An asynchronous pull, push or commit in flight.",
                     handle_docs("None for a push or commit, the rows for a pull", steps, states));
  def_handle<TablesHandle>(m, "TablesHandle", "An asynchronous multi-table pull in flight.",
                           handle_docs("{table: float32 rows [n, dim of that table]}",
                                       "{table: " + steps + "}", "{table: " + states + "}"));
}

}  // namespace cpu_dist::python
