// The shard's listening credentials: insecure transport, with the job token checked by gRPC's
// server auth filter on each call's initial metadata, before the call reaches any method.
//
// A call without the right token is refused there (UNAUTHENTICATED, the reason as its
// message) before its request is received: the server has not asked for the message yet, so
// it waits in HTTP/2 flow control and is never buffered or parsed.  That holds for every
// method, including the raw unary ones (Pull, Push, Commit) whose request gRPC otherwise receives
// whole with the call (call_reactor.h).
#pragma once

#include <functional>
#include <memory>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/status.h"

namespace cpu_dist::ps {

class PsService;

// `service` checks the token (PsService::check_token) and counts a refusal; it must outlive
// every server these credentials are added to.
std::shared_ptr<grpc::ServerCredentials> token_checking_credentials(PsService& service);

}  // namespace cpu_dist::ps
