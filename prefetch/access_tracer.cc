#include "prefetch/access_tracer.h"

#include <utility>

namespace strata {

void AccessTracer::EndIteration() {
  if (current_.empty()) return;
  previous_ = std::move(last_);
  last_ = std::move(current_);
  current_.clear();
  ++iterations_;
}

}  // namespace strata
