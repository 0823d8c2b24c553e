// The job token on the wire: every call carries it as call metadata under kTokenMetadataKey,
// and a shard checks it before it receives the request (token_gate.h).
#pragma once

#include <stdexcept>
#include <string>

namespace cpu_dist::ps {

inline constexpr const char* kTokenMetadataKey = "x-cpu-dist-token";

// Throws std::invalid_argument unless `token` can travel as call metadata (printable ASCII,
// no spaces, not empty).
inline void check_token_text(const std::string& token) {
  if (token.empty()) throw std::invalid_argument("token must not be empty");
  for (unsigned char c : token)
    if (c < 0x21 || c > 0x7e)
      throw std::invalid_argument(
          "token must be printable ASCII without spaces (it travels as gRPC call metadata)");
}

}  // namespace cpu_dist::ps
