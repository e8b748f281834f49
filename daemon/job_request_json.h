// The JSON form of a JobRequest inside job records (the NVMe record and a
// checkpoint's manifest.json). It is the form earlier daemons wrote through
// protobuf's JSON printer, now written and read here, so the record format is
// the daemon's own and no longer follows the wire schema: camelCase keys
// (snake_case also read), fields at their default left out, 64-bit numbers as
// strings (numbers also read), the mode by name (a number also read).
#ifndef STRATA_DAEMON_JOB_REQUEST_JSON_H_
#define STRATA_DAEMON_JOB_REQUEST_JSON_H_

#include "absl/status/statusor.h"
#include "daemon/job_settings.h"
#include "nlohmann/json.hpp"

namespace strata {

nlohmann::json JobRequestToJson(const JobRequest& request);
// InvalidArgument naming the field for an unknown key or a value of the wrong kind.
absl::StatusOr<JobRequest> JobRequestFromJson(const nlohmann::json& json);

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_REQUEST_JSON_H_
