// EvictionPolicy: which cached copy a tier gives up when a promotion needs
// room. Implementations: LruPolicy (here; the store's default) and, in
// prefetch/, FarthestNextUsePolicy (Belady on the predicted trace), which
// also refuses to evict a copy needed sooner than the one coming in.
//
// The store calls the policy with its own lock held: implementations must be
// quick, must not block, and must not call back into the store. Calls for one
// store are serialized by that lock.
#ifndef STRATA_TIERS_EVICTION_POLICY_H_
#define STRATA_TIERS_EVICTION_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"

namespace strata {

// A cached (not home) copy in the tier. Copies with `pinned` set are in use
// and cannot be dropped now; they are listed so a policy can see that a
// better victim is about to become free (a prefetch can then wait for it
// rather than evict something needed sooner, as Belady's MIN would).
struct EvictionCandidate {
  ShardKey key;
  uint64_t footprint_bytes = 0;
  // The store's logical time of the last acquire, or of the copy's arrival
  // when it was never acquired (a tick, not a clock time).
  uint64_t last_use_tick = 0;
  bool dirty = false;              // must be written back before it is dropped
  bool prefetched_unused = false;  // brought in by a prefetch, not yet acquired
  bool pinned = false;             // in use: never a valid choice
};

struct EvictionRequest {
  TierKind tier = TierKind::kDevice;
  // The shard the room is for. nullopt when room is made for other reasons.
  std::optional<ShardKey> incoming;
  // True when a client is waiting for `incoming` right now (a demand miss):
  // the policy must then pick a victim if there is any.
  bool demand = false;
  // A prefetch for a shard needed very soon: the policy may prefer hiding
  // its latency to the fewest fetches.
  bool urgent = false;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Index of an unpinned candidate to evict, or nullopt to refuse (the
  // promotion then fails with ResourceExhausted; choosing a pinned one counts
  // as refusing). `candidates` holds at least one unpinned copy.
  virtual std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                             absl::Span<const EvictionCandidate> candidates) = 0;
};

// Least recently used first; among equals, clean copies before dirty ones
// (dropping a clean copy costs no write-back). Stateless: the recency comes
// from the store's ticks.
class LruPolicy final : public EvictionPolicy {
 public:
  std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                     absl::Span<const EvictionCandidate> candidates) override;
};

}  // namespace strata

#endif  // STRATA_TIERS_EVICTION_POLICY_H_
