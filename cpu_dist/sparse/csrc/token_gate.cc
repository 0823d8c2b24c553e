#include "token_gate.h"

#include <stdexcept>
#include <string>
#include <string_view>

#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "service.h"
#include "token.h"

namespace cpu_dist::ps {

namespace {

// gRPC's C processor: called on a gRPC thread with the call's initial metadata; answers
// at once (the check is a constant-time compare, it never blocks).
void check_call(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md, size_t num_md,
                grpc_process_auth_metadata_done_cb done, void* user_data) {
  auto& service = *static_cast<PsService*>(state);
  const auto text = [](const grpc_slice& s) {
    return std::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                            GRPC_SLICE_LENGTH(s));
  };
  std::string token;
  bool found = false;
  for (size_t i = 0; i < num_md; ++i) {
    if (text(md[i].key) == kTokenMetadataKey) {
      token = text(md[i].value);
      found = true;
      break;
    }
  }
  const grpc::Status st = service.check_token(found ? &token : nullptr);
  if (!st.ok()) {
    const grpc::ByteBuffer none;
    service.count(&none, &none, st);
  }
  done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(st.error_code()),
       st.ok() ? nullptr : st.error_message().c_str());
}

class TokenCheckingCredentials final : public grpc::ServerCredentials {
 public:
  explicit TokenCheckingCredentials(PsService& service) : service_(service) {}
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    throw std::logic_error("the shard's credentials have their own token check");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    grpc_server_credentials_set_auth_metadata_processor(
        creds, grpc_auth_metadata_processor{&check_call, nullptr, &service_});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  PsService& service_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> token_checking_credentials(PsService& service) {
  return std::make_shared<TokenCheckingCredentials>(service);
}

}  // namespace cpu_dist::ps
