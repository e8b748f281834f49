// `strata_io_bench`: the same as `strata bench io`, as a standalone binary
// that links only core and swap (handy where the full CLI is not built).
#include "bench/io_bench.h"

int main(int argc, char** argv) { return strata::RunIoBench(argc, argv); }
