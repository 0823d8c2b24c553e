// cpu_dist.sparse._ps.Handle and TablesHandle: an asynchronous pull, push or commit in flight
// (ps-lite's wait-on-a-handle shape).  Defined here so that bind_client.cc and
// bind_client_tables.cc can return one; their Python classes are registered by bind_handle.cc.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rpc_call.h"

namespace cpu_dist::python {

namespace py = pybind11;

// What every handle is: an asynchronous operation in flight.  Dropping one is safe: the client
// keeps the operation (and the rows a pull decodes into) until its last RPC finished.
class OpHandle {
 public:
  bool done() const { return op_->done(); }
  // A pull that named a session, once done: the minimum committed step of the shards it
  // touched (None otherwise).
  std::optional<int64_t> committed_step() const { return op_->committed_seen(); }

 protected:
  explicit OpHandle(std::shared_ptr<ps::AsyncOp> op) : op_(std::move(op)) {}
  // Waits without the GIL; WaitTimeout when not done within timeout_s (None: forever), the
  // operation's error when it failed.
  void wait_done(std::optional<double> timeout_s);

  std::shared_ptr<ps::AsyncOp> op_;
  py::object result_;  // what wait() returned, once it did
};

// A pull, push or commit of one table.
class Handle : public OpHandle {
 public:
  // rows >= 0: a pull of that many keys, whose wait() returns the rows.
  explicit Handle(std::shared_ptr<ps::AsyncOp> op, py::ssize_t rows = -1, py::ssize_t dim = 0)
      : OpHandle(std::move(op)), rows_(rows), dim_(dim) {}

  py::object wait(std::optional<double> timeout_s);
  // A finished pull that asked for them: per row, the session step up to which the row holds
  // every commit (int64 min: unknown), and the rows' optimizer states.  None otherwise.
  py::object row_steps() const;
  py::object row_states() const;

 private:
  py::ssize_t rows_;
  py::ssize_t dim_;
};

// A multi-table pull in flight (Client.pull_tables_async): per table of the pull (in the
// client's table order, as the op's outputs and reports are), its name, key count and dim.
class TablesHandle : public OpHandle {
 public:
  struct Table {
    std::string name;
    py::ssize_t rows = 0;
    py::ssize_t dim = 0;
  };
  TablesHandle(std::shared_ptr<ps::AsyncOp> op, std::vector<Table> tables)
      : OpHandle(std::move(op)), tables_(std::move(tables)) {}

  // {table name: float32 rows [n, dim]}.
  py::dict wait(std::optional<double> timeout_s);
  // {table name: int64 [n]} and {table name: float32 [n] or [n, dim]} (Adagrad), once done
  // and asked for; None otherwise.
  py::object row_steps() const;
  py::object row_states() const;

 private:
  std::vector<Table> tables_;
};

void bind_handle(py::module_& m);  // bind_handle.cc

}  // namespace cpu_dist::python
