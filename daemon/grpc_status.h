// absl::Status <-> grpc::Status. The codes are the same canonical set.
#ifndef STRATA_DAEMON_GRPC_STATUS_H_
#define STRATA_DAEMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace strata {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace strata

#endif  // STRATA_DAEMON_GRPC_STATUS_H_
