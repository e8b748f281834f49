// GroupHyperparams: one param group's optimizer hyperparameters for one step
// (BeginStep), as the client sends them and the daemon keeps them (its step
// barrier and its job records). The wire form is strata.v1.GroupHyperparams,
// converted at the service edge (daemon/job_proto.h).
#ifndef STRATA_CORE_GROUP_HYPERPARAMS_H_
#define STRATA_CORE_GROUP_HYPERPARAMS_H_

namespace strata {

// Every value is used as given: fill all that the job's optimizer kind reads.
struct GroupHyperparams {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, lr_decay = 0;

  bool operator==(const GroupHyperparams&) const = default;
};

}  // namespace strata

#endif  // STRATA_CORE_GROUP_HYPERPARAMS_H_
