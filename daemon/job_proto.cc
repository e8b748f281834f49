#include "daemon/job_proto.h"

namespace strata {

std::optional<JobMode> JobModeFromProto(strata::v1::Mode mode) {
  switch (mode) {
    case strata::v1::MODE_OFFLOAD: return JobMode::kOffload;
    case strata::v1::MODE_INFINITY: return JobMode::kInfinity;
    default: return std::nullopt;
  }
}

strata::v1::Mode JobModeToProto(JobMode mode) {
  return mode == JobMode::kInfinity ? strata::v1::MODE_INFINITY : strata::v1::MODE_OFFLOAD;
}

JobRequest JobRequestFromProto(const strata::v1::CreateJobRequest& p) {
  JobRequest r;
  r.name = p.name();
  r.world_size = p.world_size();
  r.mode = JobModeFromProto(p.mode());
  r.deepspeed_config_json = p.deepspeed_config_json();
  if (p.has_optimizer()) {
    const strata::v1::OptimizerSettings& in = p.optimizer();
    JobRequest::Optimizer& o = r.optimizer.emplace();
    o.type = in.type();
    o.lr = in.lr();
    o.beta1 = in.beta1();
    o.beta2 = in.beta2();
    o.eps = in.eps();
    o.weight_decay = in.weight_decay();
    o.amsgrad = in.amsgrad();
    o.lr_decay = in.lr_decay();
    o.initial_accumulator_value = in.initial_accumulator_value();
  }
  r.param_dtype = p.param_dtype();
  r.grad_dtype = p.grad_dtype();
  r.pinned_budget_bytes = p.pinned_budget_bytes();
  r.device_budget_bytes = p.device_budget_bytes();
  r.local_ranks.assign(p.local_ranks().begin(), p.local_ranks().end());
  r.external_step_agreement = p.external_step_agreement();
  return r;
}

strata::v1::CreateJobRequest JobRequestToProto(const JobRequest& r) {
  strata::v1::CreateJobRequest p;
  p.set_name(r.name);
  p.set_world_size(r.world_size);
  p.set_mode(r.mode.has_value() ? JobModeToProto(*r.mode) : strata::v1::MODE_UNSPECIFIED);
  p.set_deepspeed_config_json(r.deepspeed_config_json);
  if (r.optimizer.has_value()) {
    const JobRequest::Optimizer& in = *r.optimizer;
    strata::v1::OptimizerSettings* o = p.mutable_optimizer();
    o->set_type(in.type);
    o->set_lr(in.lr);
    o->set_beta1(in.beta1);
    o->set_beta2(in.beta2);
    o->set_eps(in.eps);
    o->set_weight_decay(in.weight_decay);
    o->set_amsgrad(in.amsgrad);
    o->set_lr_decay(in.lr_decay);
    o->set_initial_accumulator_value(in.initial_accumulator_value);
  }
  p.set_param_dtype(r.param_dtype);
  p.set_grad_dtype(r.grad_dtype);
  p.set_pinned_budget_bytes(r.pinned_budget_bytes);
  p.set_device_budget_bytes(r.device_budget_bytes);
  p.mutable_local_ranks()->Add(r.local_ranks.begin(), r.local_ranks.end());
  p.set_external_step_agreement(r.external_step_agreement);
  return p;
}

GroupHyperparams GroupHyperparamsFromProto(const strata::v1::GroupHyperparams& g) {
  return GroupHyperparams{g.lr(), g.beta1(), g.beta2(), g.eps(), g.weight_decay(), g.lr_decay()};
}

std::vector<GroupHyperparams> GroupHyperparamsFromProto(
    const google::protobuf::RepeatedPtrField<strata::v1::GroupHyperparams>& groups) {
  std::vector<GroupHyperparams> out;
  out.reserve(groups.size());
  for (const strata::v1::GroupHyperparams& g : groups) out.push_back(GroupHyperparamsFromProto(g));
  return out;
}

absl::StatusOr<JobSettings> ResolveJobSettings(const strata::v1::CreateJobRequest& request) {
  return ResolveJobSettings(JobRequestFromProto(request));
}

}  // namespace strata
