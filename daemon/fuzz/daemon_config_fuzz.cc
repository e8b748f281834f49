// libFuzzer target: a daemon config file (protobuf text format or JSON) is
// read, resolved and described; every byte string must end in a value or an
// InvalidArgument naming the problem, never a crash, a hang or a sanitizer
// report. The file is real (LoadDaemonConfigFile reads a path), written once
// per input into a private temporary directory.
//   build-hardening/daemon/fuzz/daemon_config_fuzz daemon/fuzz/corpus/daemon_config
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <string>

#include "daemon/daemon_config.h"

namespace {

// The file each input is written to (one per fuzzing process).
const std::string& ConfigPath() {
  static const std::string* path = [] {
    char dir[] = "/tmp/strata-config-fuzz-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    static std::string* removed_at_exit = new std::string(dir);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*removed_at_exit, ec);
    });
    return new std::string(std::string(dir) + "/stratad.conf");
  }();
  return *path;
}

void Check(const absl::Status& s) {
  if (s.ok()) return;
  // Bad files are the caller's fault: a code naming that, with a message.
  if (s.message().empty()) std::abort();
  if (s.code() != absl::StatusCode::kInvalidArgument && s.code() != absl::StatusCode::kNotFound &&
      s.code() != absl::StatusCode::kFailedPrecondition) {
    std::fprintf(stderr, "unexpected status: %s\n", s.ToString().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = ConfigPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto config = strata::LoadDaemonConfigFile(path);
  Check(config.status());
  if (!config.ok()) return 0;
  auto settings = strata::ResolveDaemonSettings(*config, "/run/user/1000");
  Check(settings.status());
  if (settings.ok()) {
    const std::string text = strata::DescribeDaemonSettings(*settings);
    if (text.empty()) std::abort();
  }
  return 0;
}
