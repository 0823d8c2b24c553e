// cpu_dist.sparse._ps_client: the parameter server's client, bound for Python, as its own
// extension (issue 24 item 7).  It links the client library (ps_client: gRPC, protobuf, the
// codec) and nothing of the shard: no RocksDB, no ISA-L, so a worker that only talks to
// shards never loads them.  cpu_dist.sparse._ps (module.cc) re-exports everything here.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_ps_client, m) {
  m.doc() = "Client of the C++ parameter server (gRPC); cpu_dist.sparse._ps re-exports it";
  cpu_dist::python::bind_client(m);
}
