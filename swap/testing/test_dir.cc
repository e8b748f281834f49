#include "swap/testing/test_dir.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>

#include "core/errno_status.h"

namespace strata {

absl::StatusOr<TestDir> TestDir::Create(const std::string& prefix) {
  const char* env = std::getenv("STRATA_BINARY_DIR");
  std::string base = env != nullptr && *env != '\0' ? std::string(env) + "/test_tmp" : "/var/tmp";
  mkdir(base.c_str(), 0755);
  std::string templ = base + "/" + prefix + ".XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + templ);
  return TestDir(templ);
}

TestDir::~TestDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace strata
