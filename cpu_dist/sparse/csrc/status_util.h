// grpc::Status helpers for the service: an INVALID_ARGUMENT shorthand and early return.
#pragma once

#include <string>
#include <utility>

#include "grpcpp/support/status.h"

namespace cpu_dist::ps {

inline grpc::Status invalid(std::string msg) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(msg));
}

}  // namespace cpu_dist::ps

// Returns the status of `expr` from the enclosing function unless it is OK.
#define PS_RETURN_IF_ERROR(expr) \
  do {                           \
    ::grpc::Status _st = (expr); \
    if (!_st.ok()) return _st;   \
  } while (0)
