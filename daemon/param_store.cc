#include "daemon/param_store.h"

#include <vector>

namespace strata {

void JobRoutedPolicy::Register(JobId job, EvictionPolicy* policy) {
  absl::MutexLock lock(&mu_);
  policies_[job] = policy;
}

void JobRoutedPolicy::Unregister(JobId job) {
  absl::MutexLock lock(&mu_);
  policies_.erase(job);
}

std::optional<size_t> JobRoutedPolicy::ChooseVictim(const EvictionRequest& request,
                                                    absl::Span<const EvictionCandidate> candidates) {
  if (candidates.empty()) return std::nullopt;
  const JobId job = request.incoming.has_value() ? request.incoming->job : candidates.front().key.job;
  std::vector<EvictionCandidate> own;
  std::vector<size_t> index;
  bool own_unpinned = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].key.job != job) continue;
    own.push_back(candidates[i]);
    index.push_back(i);
    own_unpinned = own_unpinned || !candidates[i].pinned;
  }
  if (own_unpinned) {
    EvictionPolicy* policy = &lru_;
    {
      absl::MutexLock lock(&mu_);
      auto it = policies_.find(job);
      if (it != policies_.end()) policy = it->second;
    }
    std::optional<size_t> pick = policy->ChooseVictim(request, own);
    if (pick.has_value() && *pick < own.size() && !own[*pick].pinned) return index[*pick];
    if (!request.demand) return std::nullopt;  // the job's own policy keeps them all
  }
  // The tier is full of other jobs' copies: only a demand miss takes one.
  if (!request.demand) return std::nullopt;
  std::vector<EvictionCandidate> others;
  std::vector<size_t> other_index;
  bool any = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].key.job == job) continue;
    others.push_back(candidates[i]);
    other_index.push_back(i);
    any = any || !candidates[i].pinned;
  }
  if (!any) return std::nullopt;
  std::optional<size_t> pick = lru_.ChooseVictim(request, others);
  if (!pick.has_value() || *pick >= others.size()) return std::nullopt;
  return other_index[*pick];
}

absl::StatusOr<std::unique_ptr<ParamStore>> ParamStore::Create(ExtentStore* nvme, Tier* device,
                                                               const ParamStoreOptions& options) {
  if (nvme == nullptr) return absl::InvalidArgumentError("param store: an NVMe extent store is required");
  std::unique_ptr<ParamStore> ps(new ParamStore());
  ps->nvme_ = nvme;
  if (options.io_threads > 0) {
    auto io = ThreadPoolExecutor::Create(options.io_threads);
    if (!io.ok()) return io.status();
    ps->io_ = std::move(*io);
  } else {
    ps->io_ = std::make_unique<InlineExecutor>();
  }
  ps->windows_ = std::make_unique<WindowTier>(options.pinned_capacity_bytes);
  NvmeTierOptions nvme_options;
  nvme_options.delete_on_free = false;
  auto home = NvmeTier::Create(nvme, nvme_options);
  if (!home.ok()) return home.status();
  ps->home_ = std::move(*home);
  std::vector<Tier*> tiers = {ps->windows_.get(), ps->home_.get()};
  if (device != nullptr) tiers.push_back(device);
  TieredStoreOptions store_options;
  store_options.clock = &ps->clock_;
  store_options.executor = ps->io_.get();
  store_options.policy = &ps->policy_;
  // Jobs release their pins (and the registry ends dead sessions); a lease
  // never expires under a live trainer.
  store_options.default_lease = absl::Hours(24 * 365);
  auto store = TieredStore::Create(std::move(tiers), store_options);
  if (!store.ok()) return store.status();
  ps->store_ = std::move(*store);
  return ps;
}

ParamStore::~ParamStore() {
  store_.reset();  // waits for transfers, frees slots (homes stay on NVMe)
  io_.reset();
}

}  // namespace strata
