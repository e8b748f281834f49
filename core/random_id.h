// Unguessable identifiers from the kernel's CSPRNG (getrandom). Job and
// session ids and one-time tokens are capabilities a client presents, so a
// failure to get randomness is an error, never a predictable fallback.
#ifndef STRATA_CORE_RANDOM_ID_H_
#define STRATA_CORE_RANDOM_ID_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

// `n` random bytes; Unavailable (naming errno) when getrandom fails.
absl::Status FillRandom(void* out, size_t n);
// A random non-zero 64-bit id.
absl::StatusOr<uint64_t> RandomId64();
// `bytes` random bytes, hex-encoded.
absl::StatusOr<std::string> RandomHexToken(size_t bytes);

}  // namespace strata

#endif  // STRATA_CORE_RANDOM_ID_H_
