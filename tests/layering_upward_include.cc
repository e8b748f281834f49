// Compiled with strata_swap's include path by the layering tests: swap/ sits
// below tiers/, so this include must not resolve.
#include "tiers/tier.h"
