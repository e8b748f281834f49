#include "core/random_id.h"

#include <errno.h>
#include <sys/random.h>

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/errno_status.h"

namespace strata {

absl::Status FillRandom(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return absl::UnavailableError(
          absl::StrCat("getrandom failed (", ErrnoName(err), "); refusing to issue a guessable id"));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RandomId64() {
  uint64_t id = 0;
  while (id == 0) {
    if (absl::Status s = FillRandom(&id, sizeof(id)); !s.ok()) return s;
  }
  return id;
}

absl::StatusOr<std::string> RandomHexToken(size_t bytes) {
  std::vector<char> raw(bytes);
  if (absl::Status s = FillRandom(raw.data(), raw.size()); !s.ok()) return s;
  return absl::BytesToHexString(absl::string_view(raw.data(), raw.size()));
}

}  // namespace strata
