// The gRPC paths of a shard's methods (service ParameterServer of proto/ps.proto): the one
// list that the client's calls and the shard's routing (method_of, PsUnaryMethods) both use.
#pragma once

namespace cpu_dist::ps::paths {

inline constexpr const char* kPull = "/cpu_dist.ps.ParameterServer/Pull";
inline constexpr const char* kPush = "/cpu_dist.ps.ParameterServer/Push";
inline constexpr const char* kCommit = "/cpu_dist.ps.ParameterServer/Commit";
inline constexpr const char* kWaitCommitted = "/cpu_dist.ps.ParameterServer/WaitCommitted";
inline constexpr const char* kPullCommitted = "/cpu_dist.ps.ParameterServer/PullCommitted";
inline constexpr const char* kCloseSession = "/cpu_dist.ps.ParameterServer/CloseSession";
inline constexpr const char* kAbortSessions = "/cpu_dist.ps.ParameterServer/AbortSessions";
inline constexpr const char* kStats = "/cpu_dist.ps.ParameterServer/Stats";
inline constexpr const char* kHealth = "/cpu_dist.ps.ParameterServer/Health";
inline constexpr const char* kDump = "/cpu_dist.ps.ParameterServer/Dump";
inline constexpr const char* kShutdown = "/cpu_dist.ps.ParameterServer/Shutdown";
inline constexpr const char* kSave = "/cpu_dist.ps.ParameterServer/Save";
inline constexpr const char* kLoad = "/cpu_dist.ps.ParameterServer/Load";
inline constexpr const char* kCreateTables = "/cpu_dist.ps.ParameterServer/CreateTables";

}  // namespace cpu_dist::ps::paths
