#include "bench/train_bench.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/peer_process.h"

#ifndef STRATA_BENCH_TRAIN_SCRIPT
#define STRATA_BENCH_TRAIN_SCRIPT "bench/train_bench.py"
#endif
#ifndef STRATA_BENCH_PY_STAGE
#define STRATA_BENCH_PY_STAGE ""
#endif

namespace strata {
namespace {

// The stratad beside this binary (build/bin), for the strata variants.
std::string StratadBesideUs() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "stratad";
  self[n] = '\0';
  std::string path(self);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "stratad" : path.substr(0, slash + 1) + "stratad";
}

}  // namespace

int RunTrainBench(int argc, char** argv) {
  std::string python_flag;
  bool have_stratad = false;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--python") == 0) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "strata bench train: --python needs a path\n");
        return 2;
      }
      python_flag = argv[++i];
      continue;
    }
    if (std::strncmp(argv[i], "--python=", 9) == 0) {
      python_flag = argv[i] + 9;
      continue;
    }
    if (std::strcmp(argv[i], "--stratad") == 0 || std::strncmp(argv[i], "--stratad=", 10) == 0) {
      have_stratad = true;
    }
    rest.emplace_back(argv[i]);
  }
  std::string how;
  absl::StatusOr<std::string> python = FindVenvPython(python_flag, /*make_venv=*/false, &how);
  if (!python.ok()) {
    std::fprintf(stderr, "strata bench train: %s\n", std::string(python.status().message()).c_str());
    return 1;
  }
  // The strata package staged by this build, unless one is installed.
  if (std::strlen(STRATA_BENCH_PY_STAGE) > 0 && access(STRATA_BENCH_PY_STAGE, R_OK | X_OK) == 0) {
    const char* old = std::getenv("PYTHONPATH");
    std::string path = STRATA_BENCH_PY_STAGE;
    if (old != nullptr && *old != '\0') path += std::string(":") + old;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::string script = STRATA_BENCH_TRAIN_SCRIPT;
  std::vector<std::string> args = {*python, script};
  if (!have_stratad) {
    args.push_back("--stratad");
    args.push_back(StratadBesideUs());
  }
  args.insert(args.end(), rest.begin(), rest.end());
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fprintf(stderr, "strata bench train: %s (%s) %s\n", python->c_str(), how.c_str(), script.c_str());
  execv(python->c_str(), cargs.data());
  std::fprintf(stderr, "strata bench train: cannot run %s (%s)\n", python->c_str(), std::strerror(errno));
  return 1;
}

}  // namespace strata
