#include "bench/adam_peers.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/peer_process.h"

namespace strata {
namespace {

// glibc's default malloc serves torch's large temporaries (foreach, the
// upcast) with fresh mmaps, so every step pays first-touch page faults;
// keeping freed memory in the heap lets each peer run at its best.
const std::vector<std::string>& TunedMalloc() {
  static const std::vector<std::string> env = {"MALLOC_MMAP_MAX_=0", "MALLOC_TRIM_THRESHOLD_=68719476736",
                                               "MALLOC_TOP_PAD_=1073741824"};
  return env;
}

}  // namespace

std::string AdamPeerVariantKey(absl::string_view algo, absl::string_view grad, absl::string_view out) {
  return absl::StrCat(algo, ":", grad, ":", out);
}

std::vector<AdamPeerResult> MeasureAdamPeers(const AdamPeerOptions& o, const std::vector<std::string>& variants,
                                             const std::vector<int>& threads) {
  std::vector<AdamPeerResult> results;
  auto not_measured = [&](const std::string& peer, int t, const std::string& why) {
    for (const std::string& v : variants) {
      AdamPeerResult r;
      r.peer = peer;
      r.variant = v;
      r.threads = t;
      r.note = why;
      results.push_back(r);
    }
  };
  for (const std::string& peer : o.peers) {
    const bool venv_peer = peer != "torch_foreach";
    const std::string& python = venv_peer ? o.venv_python : o.debian_python;
    if (python.empty()) {
      std::printf("  peer %s: not measured: %s\n", peer.c_str(), o.venv_missing.c_str());
      for (int t : threads) not_measured(peer, t, o.venv_missing);
      continue;
    }
    if (peer == "deepspeed") {
      std::printf("  peer deepspeed: its CPU ops are JIT-built on first use (DS_ACCELERATOR=cpu, ~100 s each, "
                  "not timed; cached in ~/.cache/torch_extensions)\n");
      std::fflush(stdout);
    }
    for (int t : threads) {
      PeerCommand cmd;
      cmd.argv = {python, o.script, "--peer", peer, "--variants", absl::StrJoin(variants, ","), "--size",
                  absl::StrCat(o.size), "--threads", absl::StrCat(t), "--warmup", absl::StrCat(o.warmup),
                  "--steps", absl::StrCat(o.steps)};
      if (!o.build_deepspeed_ops) cmd.argv.push_back("--no-build");
      cmd.env = TunedMalloc();
      cmd.env.push_back(absl::StrCat("OMP_NUM_THREADS=", t));
      cmd.env.push_back(absl::StrCat("MKL_NUM_THREADS=", t));
      cmd.env.push_back("DS_ACCELERATOR=cpu");
      absl::StatusOr<PeerOutput> out = RunPeerProcess(cmd);
      if (!out.ok()) {
        std::printf("  peer %s, %d thread%s: cannot run %s: %s\n", peer.c_str(), t, t == 1 ? "" : "s",
                    python.c_str(), std::string(out.status().message()).c_str());
        not_measured(peer, t, std::string(out.status().message()));
        continue;
      }
      size_t before = results.size();
      for (const nlohmann::json& j : out->lines) {
        if (!j.contains("variant") || !j["variant"].is_string()) continue;
        AdamPeerResult r;
        r.peer = peer;
        r.variant = j["variant"].get<std::string>();
        r.threads = t;
        r.version = j.value("version", "");
        if (j.contains("min_step_s") && j["min_step_s"].is_number() && j["min_step_s"].get<double>() > 0) {
          r.best_step_s = j["min_step_s"].get<double>();
          r.elements_per_s = static_cast<double>(o.size) / r.best_step_s;
          r.cpu_share = j.value("cpu_share", 0.0);
          std::printf("  peer %-13s %d thread%s %-20s %8.1f ms/step %7.3f Gelem/s (cpu %3.0f%%, %s)\n",
                      peer.c_str(), t, t == 1 ? " " : "s", r.variant.c_str(), r.best_step_s * 1e3,
                      r.elements_per_s / 1e9, 100 * r.cpu_share, r.version.c_str());
        } else {
          r.note = j.contains("unsupported") ? j["unsupported"].get<std::string>()
                                             : j.value("error", std::string("no result"));
          std::printf("  peer %-13s %d thread%s %-20s not measured: %s\n", peer.c_str(), t, t == 1 ? " " : "s",
                      r.variant.c_str(), r.note.c_str());
        }
        std::fflush(stdout);
        results.push_back(std::move(r));
      }
      if (results.size() == before) {
        const std::string why = absl::StrCat(peer, " failed: ", PeerFailure(*out));
        std::printf("  peer %s, %d thread%s: %s\n", peer.c_str(), t, t == 1 ? "" : "s", why.c_str());
        not_measured(peer, t, why);
      }
    }
  }
  return results;
}

nlohmann::json AdamPeersJson(const std::vector<AdamPeerResult>& results, const std::string& variant,
                             int threads) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* name : kAdamPeerNames) j[name] = nullptr;
  for (const AdamPeerResult& r : results) {
    if (r.variant == variant && r.threads == threads && r.elements_per_s > 0) j[r.peer] = r.elements_per_s;
  }
  return j;
}

double BestAdamPeer(const std::vector<AdamPeerResult>& results, const std::string& variant, int threads,
                    std::string* which) {
  double best = 0;
  which->clear();
  for (const AdamPeerResult& r : results) {
    if (r.variant == variant && r.threads == threads && r.elements_per_s > best) {
      best = r.elements_per_s;
      *which = r.peer;
    }
  }
  return best;
}

nlohmann::json PrintAdamPeerTable(const std::vector<AdamOurRow>& ours, const std::vector<AdamPeerResult>& peers) {
  auto gelem = [](double eps) { return eps > 0 ? absl::StrFormat("%.3f", eps / 1e9) : std::string("-"); };
  std::printf("\nvs peers (Gelem/s, each peer's fastest step; 16-bit variants: upcast + step + downcast):\n");
  std::printf("%-20s %3s %8s %11s %9s %13s %9s %-13s\n", "variant", "thr", "ours", "torch_fused", "deepspeed",
              "torch_foreach", "x best", "best peer");
  for (const AdamOurRow& r : ours) {
    double peer[3] = {0, 0, 0};
    for (const AdamPeerResult& p : peers) {
      if (p.variant != r.variant || p.threads != r.threads) continue;
      for (int k = 0; k < 3; ++k) {
        if (p.peer == kAdamPeerNames[k]) peer[k] = p.elements_per_s;
      }
    }
    std::string which;
    double best = BestAdamPeer(peers, r.variant, r.threads, &which);
    std::printf("%-20s %3d %8.3f %11s %9s %13s %9s %-13s\n", r.label.c_str(), r.threads, r.elements_per_s / 1e9,
                gelem(peer[0]).c_str(), gelem(peer[1]).c_str(), gelem(peer[2]).c_str(),
                best > 0 ? absl::StrFormat("%.2fx", r.elements_per_s / best).c_str() : "-",
                best > 0 ? which.c_str() : "none");
  }
  struct Target {
    const char* name;
    const char* variant;
    double min_ratio;
  };
  const Target targets[] = {{"adamw fp32 grad, 2 threads", "adamw:fp32:none", 1.3},
                            {"adamw fp16 grad + fp16 copy, 2 threads", "adamw:fp16:fp16", 1.5}};
  nlohmann::json out = nlohmann::json::array();
  std::printf("\ntargets vs the best peer (issue 12.2):\n");
  for (const Target& t : targets) {
    const AdamOurRow* row = nullptr;
    for (const AdamOurRow& r : ours) {
      if (r.variant == t.variant && r.threads == 2) row = &r;
    }
    std::string which;
    double best = row == nullptr ? 0 : BestAdamPeer(peers, t.variant, 2, &which);
    nlohmann::json j = {{"target", t.name}, {"variant", t.variant}, {"threads", 2}, {"min_ratio", t.min_ratio}};
    if (row == nullptr || best <= 0) {
      std::printf("  %-40s not checked (%s)\n", t.name, row == nullptr ? "no 2-thread run" : "no peer measured");
      j["ratio"] = nullptr;
      j["met"] = nullptr;
    } else {
      double ratio = row->elements_per_s / best;
      std::printf("  %-40s %.2fx %s (>= %.1fx) -> %s\n", t.name, ratio, which.c_str(), t.min_ratio,
                  ratio >= t.min_ratio ? "MET" : "MISSED");
      j["ratio"] = ratio;
      j["best_peer"] = which;
      j["met"] = ratio >= t.min_ratio;
    }
    out.push_back(j);
  }
  return out;
}

nlohmann::json AdamPeerResultsJson(const std::vector<AdamPeerResult>& peers) {
  nlohmann::json out = nlohmann::json::array();
  for (const AdamPeerResult& p : peers) {
    nlohmann::json j = {{"peer", p.peer}, {"variant", p.variant}, {"threads", p.threads}, {"version", p.version}};
    if (p.elements_per_s > 0) {
      j["elements_per_s"] = p.elements_per_s;
      j["best_step_s"] = p.best_step_s;
      j["cpu_share"] = p.cpu_share;
    } else {
      j["elements_per_s"] = nullptr;
      j["not_measured"] = p.note;
    }
    out.push_back(j);
  }
  return out;
}

}  // namespace strata
