// Propagation macros for absl::Status and absl::StatusOr.
//
// Debian 12's Abseil (20220623) has no status_macros.h, so strata defines the
// two it needs, modelled on Abseil's later header. These and STRATA_CHECK are
// the only macros the project defines.
#ifndef STRATA_CORE_STATUS_MACROS_H_
#define STRATA_CORE_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_INTERNAL_CONCAT_INNER(a, b) a##b
#define STRATA_INTERNAL_CONCAT(a, b) STRATA_INTERNAL_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define STRATA_RETURN_IF_ERROR(expr)                          \
  do {                                                        \
    ::absl::Status strata_status_ = (expr);                   \
    if (!strata_status_.ok()) return strata_status_;          \
  } while (false)

// `STRATA_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value of a StatusOr
// to `lhs`, or returns its status from the enclosing function.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr)                                     \
  STRATA_INTERNAL_ASSIGN_OR_RETURN(                                            \
      STRATA_INTERNAL_CONCAT(strata_statusor_, __LINE__), lhs, expr)

#define STRATA_INTERNAL_ASSIGN_OR_RETURN(statusor, lhs, expr) \
  auto statusor = (expr);                                     \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

// Invariants that only a bug in strata can break. Anything a user, a file or
// the kernel can cause is a Status, never a CHECK.
#define STRATA_CHECK(cond)                                                   \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: STRATA_CHECK failed: %s\n", __FILE__,     \
                   __LINE__, #cond);                                         \
      std::abort();                                                          \
    }                                                                        \
  } while (false)

#endif  // STRATA_CORE_STATUS_MACROS_H_
