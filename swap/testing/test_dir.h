// A scratch directory for tests that do real file I/O, removed with its
// contents on destruction.
//
// It lives under $STRATA_BINARY_DIR (set by ctest) or else /var/tmp, never
// /tmp, which is tmpfs on many machines and may refuse O_DIRECT.
#ifndef STRATA_SWAP_TESTING_TEST_DIR_H_
#define STRATA_SWAP_TESTING_TEST_DIR_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata {

class TestDir {
 public:
  static absl::StatusOr<TestDir> Create(const std::string& prefix);
  TestDir(TestDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TestDir& operator=(TestDir&&) = delete;
  TestDir(const TestDir&) = delete;
  ~TestDir();

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit TestDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_TEST_DIR_H_
