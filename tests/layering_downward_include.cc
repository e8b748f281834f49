// Compiled with strata_swap's include path: swap/ may use core/.
#include "core/shard_key.h"
#include "swap/extent_store.h"
