#include "daemon/daemon_stats.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/job.h"

namespace strata {

std::vector<strata::v1::TierStats> CollectTierStats(const ExtentStore* nvme, const PinnedBudget& pinned,
                                                    const DeviceArena* device) {
  std::vector<strata::v1::TierStats> tiers;
  if (device != nullptr) {
    // The arena (--device_capacity) and the bytes of shard slots in it now.
    strata::v1::TierStats d;
    d.set_tier("device");
    d.set_capacity_bytes(device->capacity_bytes());
    d.set_used_bytes(device->used_bytes());
    tiers.push_back(d);
  }
  if (nvme != nullptr) {
    const ExtentStoreStats s = nvme->Stats();
    strata::v1::TierStats t;
    t.set_tier("nvme");
    t.set_capacity_bytes(s.capacity_bytes);
    t.set_used_bytes(s.used_bytes);
    tiers.push_back(t);
  }
  // What jobs reserved of --pinned_capacity (regions, host states, NVMe
  // staging); back to 0 when every job is gone.
  strata::v1::TierStats p;
  p.set_tier("pinned");
  p.set_capacity_bytes(pinned.capacity());
  p.set_used_bytes(pinned.used());
  tiers.push_back(p);
  return tiers;
}

std::vector<strata::v1::JobTierStats> JobTierRows(const Job& job, const JobCounters& c) {
  std::vector<strata::v1::JobTierStats> rows;
  auto set_acquires = [](const ParamTierStats& t, strata::v1::JobTierStats& row) {
    row.set_hits(t.hits);
    row.set_misses(t.misses + t.waits_in_flight);
    row.set_stall_s(t.stall_s);
    row.set_prefetches(t.prefetches);
    row.set_prefetches_unused(t.prefetches_unused);
  };
  const bool infinity = job.settings().mode == JobMode::kInfinity;
  strata::v1::JobTierStats& pinned = rows.emplace_back();
  pinned.set_tier("pinned");
  pinned.set_bytes(infinity ? c.window_resident_bytes : c.pinned_reserved_bytes);
  pinned.set_budget_bytes(infinity ? c.window_budget_bytes : c.pinned_reserved_bytes);
  set_acquires(c.params.window, pinned);
  if (job.settings().device_budget_bytes > 0) {
    // The job's share of the device tier: its budget, and the bytes its
    // shards' copies take in its arena now.
    strata::v1::JobTierStats& device = rows.emplace_back();
    device.set_tier("device");
    device.set_bytes(c.params.device.bytes);
    device.set_budget_bytes(job.settings().device_budget_bytes);
    set_acquires(c.params.device, device);
  }
  if (infinity) {
    strata::v1::JobTierStats& nvme = rows.emplace_back();
    nvme.set_tier("nvme");
    nvme.set_bytes_read(c.params.bytes_read + c.grad_bytes_read_back);
    nvme.set_bytes_written(c.params.bytes_written + c.grad_bytes_spilled);
  }
  return rows;
}

strata::v1::StepTimes StepTimesProto(const StepTimes& t) {
  strata::v1::StepTimes p;
  p.set_gradients_in_s(t.gradients_in_s);
  p.set_stream_s(t.stream_s);
  p.set_load_wait_s(t.load_wait_s);
  p.set_save_wait_s(t.save_wait_s);
  p.set_optimizer_s(t.optimizer_s);
  p.set_grads_back_s(t.grads_back_s);
  p.set_params_home_s(t.params_home_s);
  p.set_end_s(t.end_s);
  p.set_commit_s(t.commit_s);
  p.set_shards_early(t.shards_early);
  p.set_early_passes(t.early_passes);
  p.set_early_stream_s(t.early_stream_s);
  p.set_early_load_wait_s(t.early_load_wait_s);
  p.set_early_params_home_s(t.early_params_home_s);
  p.set_grad_bytes_spilled(t.grad_bytes_spilled);
  p.set_grad_bytes_read_back(t.grad_bytes_read_back);
  return p;
}

std::string RenderMetrics(const JobRegistry& registry, const ExtentStore* nvme, const PinnedBudget& pinned,
                          const DeviceArena* device) {
  std::string out;
  auto metric = [&out](const std::string& name, const std::string& help, const std::string& type) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  };
  const std::vector<strata::v1::TierStats> tiers = CollectTierStats(nvme, pinned, device);
  metric("strata_tier_capacity_bytes",
         "Capacity of a tier (device: --device_capacity; pinned: --pinned_capacity, 0 = unlimited).", "gauge");
  for (const auto& t : tiers) absl::StrAppend(&out, "strata_tier_capacity_bytes{tier=\"", t.tier(), "\"} ", t.capacity_bytes(), "\n");
  metric("strata_tier_used_bytes", "Bytes in use in a tier.", "gauge");
  for (const auto& t : tiers) absl::StrAppend(&out, "strata_tier_used_bytes{tier=\"", t.tier(), "\"} ", t.used_bytes(), "\n");
  if (nvme != nullptr || device != nullptr) {
    metric("strata_tier_free_bytes", "Free bytes in a tier.", "gauge");
    if (device != nullptr) {
      absl::StrAppend(&out, "strata_tier_free_bytes{tier=\"device\"} ",
                      device->capacity_bytes() - std::min(device->capacity_bytes(), device->used_bytes()), "\n");
    }
    if (nvme != nullptr) absl::StrAppend(&out, "strata_tier_free_bytes{tier=\"nvme\"} ", nvme->Stats().free_bytes, "\n");
  }
  if (device != nullptr) {
    // Admission: what the live jobs' device budgets promise of --device_capacity.
    metric("strata_device_budgets_bytes", "Sum of the live jobs' device budgets (at most --device_capacity).", "gauge");
    absl::StrAppend(&out, "strata_device_budgets_bytes ", registry.DeviceBudgetsBytes(), "\n");
  }
  const auto jobs = registry.Jobs();
  struct JobMetric {
    const char* name;
    const char* help;
    const char* type;
    std::function<double(const Job&, const JobCounters&)> value;
  };
  const JobMetric job_metrics[] = {
      {"strata_job_step", "Steps the job has completed (applied or skipped).", "counter",
       [](const Job& j, const JobCounters&) { return static_cast<double>(j.next_step()); }},
      {"strata_job_steps_skipped_total", "Steps skipped for gradient overflow.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.steps_skipped); }},
      {"strata_job_last_step_seconds", "Duration of the last optimizer step.", "gauge",
       [](const Job&, const JobCounters& c) { return c.last_step_s; }},
      {"strata_job_step_seconds_total", "Time spent in optimizer steps.", "counter",
       [](const Job&, const JobCounters& c) { return c.total_step_s; }},
      {"strata_job_loss_scale", "Current loss scale.", "gauge",
       [](const Job& j, const JobCounters&) { return j.loss_scale(); }},
      {"strata_job_param_hits_total", "Param acquires served from memory.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.hits); }},
      {"strata_job_param_misses_total", "Param acquires that waited for NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.misses + c.params.waits_in_flight); }},
      {"strata_job_stall_seconds_total", "Time acquires waited for params.", "counter",
       [](const Job&, const JobCounters& c) { return c.params.stall_s; }},
      {"strata_job_nvme_read_bytes_total", "Param bytes read from NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.bytes_read); }},
      {"strata_job_nvme_written_bytes_total", "Param bytes written to NVMe.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.bytes_written); }},
      {"strata_job_prefetches_total", "Param prefetches issued.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.prefetches); }},
      {"strata_job_prefetches_unused_total", "Prefetched params dropped unused.", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.params.prefetches_unused); }},
      {"strata_job_pinned_reserved_bytes", "What the job reserved of the daemon's pinned capacity.", "gauge",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.pinned_reserved_bytes); }},
      {"strata_job_window_budget_bytes", "ZeRO-Infinity: the job's window budget (params and gradients).", "gauge",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.window_budget_bytes); }},
      {"strata_job_window_resident_bytes", "ZeRO-Infinity: bytes its ranks' windows hold now.", "gauge",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.window_resident_bytes); }},
      {"strata_job_device_budget_bytes", "The job's device budget (its share of --device_capacity).", "gauge",
       [](const Job& j, const JobCounters&) { return static_cast<double>(j.settings().device_budget_bytes); }},
      {"strata_job_grad_spilled_bytes_total", "ZeRO-Infinity: gradients written to NVMe (window full).", "counter",
       [](const Job&, const JobCounters& c) { return static_cast<double>(c.grad_bytes_spilled); }},
  };
  std::vector<JobCounters> counters;
  for (const auto& job : jobs) counters.push_back(job->counters());
  for (const JobMetric& m : job_metrics) {
    metric(m.name, m.help, m.type);
    for (size_t i = 0; i < jobs.size(); ++i) {
      absl::StrAppend(&out, m.name, "{job=\"", jobs[i]->settings().name, "\"} ", m.value(*jobs[i], counters[i]), "\n");
    }
  }
  // Per job and tier, the rows `strata stats` prints: the window ("pinned")
  // and, for a job with a device budget, its device arena ("device").
  struct TierMetric {
    const char* name;
    const char* help;
    const char* type;
    // Integers as integers: StrCat of a double keeps six digits.
    std::function<std::string(const strata::v1::JobTierStats&)> value;
  };
  const TierMetric tier_metrics[] = {
      {"strata_job_tier_bytes", "Bytes the job holds in a tier now (pinned: its window; device: its arena).", "gauge",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.bytes()); }},
      {"strata_job_tier_budget_bytes", "The job's budget in a tier.", "gauge",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.budget_bytes()); }},
      {"strata_job_tier_hits_total", "Param acquires into a tier that found the shard there.", "counter",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.hits()); }},
      {"strata_job_tier_misses_total", "Param acquires into a tier that waited for the shard to arrive.", "counter",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.misses()); }},
      {"strata_job_tier_stall_seconds_total", "Time param acquires into a tier waited.", "counter",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.stall_s()); }},
      {"strata_job_tier_prefetches_total", "Param prefetches into a tier.", "counter",
       [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.prefetches()); }},
      {"strata_job_tier_prefetches_unused_total", "Param prefetches dropped from a tier before any acquire.",
       "counter", [](const strata::v1::JobTierStats& t) { return absl::StrCat(t.prefetches_unused()); }},
  };
  std::vector<std::vector<strata::v1::JobTierStats>> rows;
  for (size_t i = 0; i < jobs.size(); ++i) rows.push_back(JobTierRows(*jobs[i], counters[i]));
  for (const TierMetric& m : tier_metrics) {
    metric(m.name, m.help, m.type);
    for (size_t i = 0; i < jobs.size(); ++i) {
      for (const strata::v1::JobTierStats& t : rows[i]) {
        if (t.tier() == "nvme") continue;  // its traffic is in strata_job_nvme_*
        absl::StrAppend(&out, m.name, "{job=\"", jobs[i]->settings().name, "\",tier=\"", t.tier(), "\"} ",
                        m.value(t), "\n");
      }
    }
  }
  return out;
}

}  // namespace strata
