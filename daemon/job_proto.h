// The service edge: strata.v1 messages to and from the daemon's own types.
// Inside the daemon a job is a JobRequest / JobSettings with a JobMode and
// per-group GroupHyperparams; proto types stop here (and in the handlers of
// daemon/strata_service.cc that call these).
#ifndef STRATA_DAEMON_JOB_PROTO_H_
#define STRATA_DAEMON_JOB_PROTO_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/group_hyperparams.h"
#include "core/job_mode.h"
#include "daemon/job_settings.h"
#include "strata/v1/strata.pb.h"

namespace strata {

// nullopt for MODE_UNSPECIFIED or a value this daemon does not know.
std::optional<JobMode> JobModeFromProto(strata::v1::Mode mode);
strata::v1::Mode JobModeToProto(JobMode mode);

JobRequest JobRequestFromProto(const strata::v1::CreateJobRequest& request);
// attach_if_exists is not part of a JobRequest (it is how to create, not what).
strata::v1::CreateJobRequest JobRequestToProto(const JobRequest& request);

GroupHyperparams GroupHyperparamsFromProto(const strata::v1::GroupHyperparams& groups);
std::vector<GroupHyperparams> GroupHyperparamsFromProto(
    const google::protobuf::RepeatedPtrField<strata::v1::GroupHyperparams>& groups);

// ResolveJobSettings(JobRequestFromProto(request)).
absl::StatusOr<JobSettings> ResolveJobSettings(const strata::v1::CreateJobRequest& request);

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_PROTO_H_
